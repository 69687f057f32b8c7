"""A queued job's place in line and its ETAs, from the workers' own measurements."""
from __future__ import annotations

from api.services import Services
from common.eta import estimate, max_tokens_of, place_fields
from common.schemas import JobStatus


def queue_eta(svc: Services, record: dict, ahead: int | None = None) -> dict:
    """`queue_position` and `estimated_start` / `estimated_finish` (epoch s) for a queued job;
    `ahead`: the jobs ahead of it, when its admission read them already."""
    if record.get("status") != JobStatus.QUEUED:
        return {}
    if ahead is None:
        ahead = svc.jobs.queue_position(record)
    if ahead is None:
        return {}
    return place_fields(ahead, estimate(ahead, max_tokens_of(record), svc.fleet.loads(record.get("model"))))
