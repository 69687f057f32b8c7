"""Queue position, ETAs and a computed Retry-After, from the workers' own measurements."""
from __future__ import annotations

from api.services import Services
from common.eta import WorkerLoad, estimate, max_tokens_of, place_fields, retry_after


def _loads(svc: Services, model: str | None) -> list[WorkerLoad]:
    return [WorkerLoad.from_heartbeat(w) for w in svc.store.live_workers()
            if model is None or w.get("model") == model]


def queue_eta(svc: Services, record: dict) -> dict:
    """`queue_position` and `estimated_start` / `estimated_finish` (epoch s) for a queued job."""
    if record.get("status") != "queued":
        return {}
    ahead = svc.store.queue_position(record)
    if ahead is None:
        return {}
    return place_fields(ahead, estimate(ahead, max_tokens_of(record), _loads(svc, record.get("model"))))


def queue_retry_after(svc: Services) -> int:
    """Seconds until the full queue has room again, at the rate the workers measure."""
    excess = max(svc.store.queue_depth() - svc.settings.max_queue, 0)
    return retry_after(excess, _loads(svc, None))
