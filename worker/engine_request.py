"""A job record's request as the engine takes it: the engines know nothing of job records."""
from __future__ import annotations

import hashlib
import json

from common.continuation import Continuation
from worker.engine.sequence import Continued, EngineRequest, ResponseFormat, Sampling


def engine_sampling(sampling: dict, job_id: str | None = None) -> Sampling:
    """The job record's sampling dict (validated by the API) as the engine's `Sampling`. A
    sampled job without a seed of its own is seeded from its id: each attempt of the job then
    samples alike, so one that must start over after its worker was lost says again what its
    streams were sent (api/ and common/attempts.py join the two), while other jobs differ."""
    fmt = sampling.get("response_format")
    if fmt is not None:
        spec = fmt.get("json_schema") or {}
        schema = json.dumps(spec["schema"]) if "schema" in spec else None
        fmt = ResponseFormat(fmt["type"], schema)
    seed = sampling.get("seed")
    if seed is None and job_id is not None and sampling.get("temperature", 0) > 0:
        seed = int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=4).digest()) >> 1
    return Sampling(**{**sampling, "stop": tuple(sampling.get("stop", ())), "response_format": fmt, "seed": seed})


def engine_request(job_id: str, request: dict, so_far: Continuation) -> EngineRequest:
    """The record's `request` for the engine, continuing the answer `so_far` when it has chunks."""
    continued = Continued(so_far.token_ids, so_far.text) if so_far.chunks else None
    return EngineRequest(job_id, request["prompt_token_ids"], engine_sampling(request["sampling"], job_id),
                         continued)
