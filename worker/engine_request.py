"""A job record's request as the engine takes it: the engines know nothing of job records."""
from __future__ import annotations

import json

from common.continuation import Continuation
from worker.engine.sequence import Continued, EngineRequest, ResponseFormat, Sampling


def engine_sampling(sampling: dict) -> Sampling:
    """The job record's sampling dict (validated by the API) as the engine's `Sampling`."""
    fmt = sampling.get("response_format")
    if fmt is not None:
        spec = fmt.get("json_schema") or {}
        schema = json.dumps(spec["schema"]) if "schema" in spec else None
        fmt = ResponseFormat(fmt["type"], schema)
    return Sampling(**{**sampling, "stop": tuple(sampling.get("stop", ())), "response_format": fmt})


def engine_request(job_id: str, request: dict, so_far: Continuation) -> EngineRequest:
    """The record's `request` for the engine, continuing the answer `so_far` when it has chunks."""
    continued = Continued(so_far.token_ids, so_far.text) if so_far.chunks else None
    return EngineRequest(job_id, request["prompt_token_ids"], engine_sampling(request["sampling"]), continued)
