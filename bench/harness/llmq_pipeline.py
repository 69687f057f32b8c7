"""OpenVINO GenAI's pipeline exactly as llmq's worker builds it (the same source, weights,
scheduler, threads and precision, from the same LLMQ_* settings), for the programs that measure
the engine without llmq around it: openvino_app.py (behind a minimal server) and engine_app.py
(driven in process)."""
from __future__ import annotations

import logging
import time
from typing import Any

from common.models import ModelRef, resolve_model
from worker.engine.openvino_core import build_pipeline
from worker.engine.openvino_model import choose_source

log = logging.getLogger(__name__)


def llmq_pipeline(settings) -> tuple[ModelRef, Any, dict[str, Any]]:
    """(the model, its pipeline, what llmq's heartbeat would say of it)."""
    model = resolve_model(settings, prepare=True)
    source, weights = choose_source(model, settings)
    started = time.monotonic()
    pipeline, info = build_pipeline(source, model.path, settings)
    info.update(weights=weights, source=str(source), load_s=round(time.monotonic() - started, 2))
    log.info("OpenVINO pipeline ready on %s: %s", source, info)
    return model, pipeline, info
