"""Queue position, ETAs and a computed Retry-After, from the workers' own measurements."""
from __future__ import annotations

import time

from api.services import Services
from common.eta import WorkerLoad, estimate, retry_after


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
    eta = {"queue_position": ahead + 1}
    max_tokens = (record.get("request") or {}).get("sampling", {}).get("max_tokens", 256)
    guess = estimate(ahead, max_tokens, _loads(svc, record.get("model")))
    if guess is not None:
        now = time.time()
        eta.update(estimated_start=round(now + guess.start_in_s, 2),
                   estimated_finish=round(now + guess.finish_in_s, 2))
    return eta


def queue_retry_after(svc: Services) -> int:
    """Seconds until the full queue has room again, at the rate the workers measure."""
    excess = max(svc.store.queue_depth() - svc.settings.max_queue, 0)
    return retry_after(excess, _loads(svc, None))
