"""Which engines may run a model's jobs, so that logprobs an engine cannot give are refused with a
400 when the request comes, not when a worker takes it (common/logprobs.py has the limits)."""
from __future__ import annotations

from api.services import Services
from common.logprobs import check_engines
from common.schemas import JobRequest


def engines_for(svc: Services, model: str | None) -> set[str]:
    """The engines of the live workers holding `model`; without one, the engine its settings name
    (empty for `auto` with no worker up: the worker that takes the job then refuses what its
    engine cannot give, and the job fails with that reason)."""
    name = svc.admission.model(model)[0].name
    live = {w.get("engine") for w in svc.registry.live() if w.get("model") == name and w.get("engine")}
    if live:
        return live
    entry = svc.admission.catalog.get(model)
    engine = (entry.overrides if entry is not None else {}).get("engine", svc.settings.engine)
    return set() if engine == "auto" else {engine}


def check_logprobs(svc: Services, req: JobRequest) -> None:
    """A 400 naming the engine's limit when the request asks for logprobs it cannot have."""
    if req.logprobs:
        check_engines(engines_for(svc, req.model), req.top_logprobs)
