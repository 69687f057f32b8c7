"""A queued job's place in line and its ETAs, from the workers' own measurements."""
from __future__ import annotations

from api.services import Services
from common.eta import estimate, fleet_loads, max_tokens_of, place_fields
from common.schemas import JobStatus


def queue_eta(svc: Services, record: dict) -> dict:
    """`queue_position` and `estimated_start` / `estimated_finish` (epoch s) for a queued job."""
    if record.get("status") != JobStatus.QUEUED:
        return {}
    ahead = svc.jobs.queue_position(record)
    if ahead is None:
        return {}
    live, model = svc.registry.live(), record.get("model")
    cold = not any(w.get("model") == model for w in live)  # then its last load time counts
    loads = fleet_loads(live, svc.model_loads.last() if cold else {}).get(model, [])
    return place_fields(ahead, estimate(ahead, max_tokens_of(record), loads))
