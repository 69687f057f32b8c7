"""Celery glue for batches: the one task, `llmq.batch.advance(batch_id)`, on the model-less batch
queue (`Keys.batch_queue`), and the watchdog that keeps every active batch moving.

A step runs under the batch's lock (so two never run at once), then schedules the next one
(`common.batches.kick`) unless the batch has ended. The chain can break: a worker killed between
steps, Redis gone when the next step was to be sent. The watchdog, a thread in every control worker,
kicks any active batch whose last step is older than `_STALE_S`; all state is in Redis and every
step is idempotent, so a kick too many costs one look.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid

import redis

from common.admission import Admission
from common.batches import TASK_BATCH_ADVANCE, kick
from common.lua import script
from common.stores import Stores
from worker.batch_runner import BatchRunner
from worker.control_app import app, stores

log = logging.getLogger(__name__)
_LOCK_TTL_S = 20
_STALE_S = 20.0
_admission: Admission | None = None


def admission() -> Admission:
    global _admission
    if _admission is None:
        _admission = Admission(stores())
    return _admission


@app.task(name=TASK_BATCH_ADVANCE, bind=True, acks_late=True, reject_on_worker_lost=True)
def advance(self, batch_id: str) -> None:
    svc = stores()
    keys = svc.keys
    if svc.redis.get(keys.batch_part(batch_id, "tick")) != self.request.id:
        return  # a newer kick replaced this chain
    lock, token = keys.batch_part(batch_id, "lock"), uuid.uuid4().hex
    if not svc.redis.set(lock, token, nx=True, ex=_LOCK_TTL_S):
        return  # another step runs now; it schedules the next one

    def renew() -> None:
        svc.redis.expire(lock, _LOCK_TTL_S)
        svc.redis.hset(keys.batch(batch_id), "advanced_at", time.time())

    try:
        done = BatchRunner(admission()).advance(batch_id, renew)
    finally:
        script(svc.redis, "lock_release")(keys=[lock], args=[token])
    if not done:
        kick(svc.redis, svc.celery, keys, batch_id, countdown=svc.settings.batch_poll_s)


def watchdog_pass(svc: Stores, stale_s: float = _STALE_S) -> list[str]:
    """Kick every active batch whose last step is older than `stale_s`; the kicked ids."""
    kicked = []
    for batch_id in svc.redis.smembers(svc.keys.batches_active):
        advanced = svc.redis.hget(svc.keys.batch(batch_id), "advanced_at")
        if advanced is None or time.time() - float(advanced) > stale_s:
            if advanced is None and not svc.redis.exists(svc.keys.batch(batch_id)):
                svc.redis.srem(svc.keys.batches_active, batch_id)
                continue
            kick(svc.redis, svc.celery, svc.keys, batch_id)
            kicked.append(batch_id)
    return kicked


def start_watchdog(interval_s: float = 10.0) -> threading.Thread:
    def loop() -> None:
        while True:
            try:
                kicked = watchdog_pass(stores())
                if kicked:
                    log.info("watchdog: kicked batches %s", ", ".join(kicked))
            except (redis.RedisError, OSError) as exc:
                log.warning("watchdog: %s", exc)
            except Exception:
                log.exception("watchdog pass failed")
            time.sleep(interval_s)

    thread = threading.Thread(target=loop, name="batch-watchdog", daemon=True)
    thread.start()
    return thread
