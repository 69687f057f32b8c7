"""Liveness and readiness: Redis, live workers (Celery ping), queue depth, model, batching mode."""
from __future__ import annotations


import redis
from flask import Blueprint, jsonify

from api.services import services

bp = Blueprint("health", __name__)


@bp.get("/health")
def health():
    svc = services()
    body = {"status": "ok", "redis": "ok", "parallel_mode": "continuous_batching"}
    try:
        svc.redis.ping()
    except redis.RedisError as exc:
        body.update(status="unavailable", redis=f"error: {exc}")
        return jsonify(body), 503
    try:
        model, _ = svc.model()
        body["model"] = {"name": model.name, "source": model.source, "path": str(model.path)}
    except Exception as exc:  # not prepared yet: still report the rest
        body["model"] = {"name": None, "error": str(exc)}
    replies = svc.celery.control.ping(timeout=svc.settings.health_ping_timeout_s)
    body["workers"] = sorted(name for reply in replies for name in reply)
    body["workers_detail"] = svc.store.live_workers()
    body["queue_depth"] = svc.store.queue_depth()
    if not body["workers"]:
        body["status"] = "degraded"  # jobs are accepted and wait in the queue
    return jsonify(body)
