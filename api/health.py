"""Liveness and readiness: Redis, live workers, queue depth, model, batching mode.

`GET /health` is what load balancers and probes poll, so it answers from Redis alone in a few
milliseconds: workers are the ones whose heartbeat (written every `LLMQ_HEARTBEAT_S`) is still
fresh. `GET /health?deep=1` also pings the workers through the broker (Celery's remote control),
which proves their consumers answer but waits up to `LLMQ_HEALTH_PING_TIMEOUT_S` for replies.
"""
from __future__ import annotations

import redis
from flask import Blueprint, jsonify, request

from api.services import services
from common.demand import model_state

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
        model, _ = svc.admission.model()
        body["model"] = {"name": model.name, "source": model.source, "path": str(model.path)}
    except Exception as exc:  # not prepared yet: still report the rest
        body["model"] = {"name": None, "error": str(exc)}
    body["workers_detail"] = svc.registry.live()
    body["models"] = {d.model: model_state(d, body["workers_detail"])
                      for d in svc.model_demands(body["workers_detail"])}
    body["workers"] = sorted(info["name"] for info in body["workers_detail"])
    body["queue_depth"] = svc.jobs.queue_depth()
    if request.args.get("deep", "").lower() in ("1", "true", "yes"):
        replies = svc.celery.control.ping(timeout=svc.settings.health_ping_timeout_s)
        body["celery_workers"] = sorted(name for reply in replies for name in reply)
        if not body["celery_workers"]:
            body["workers"] = []  # heartbeats alone do not prove a consumer answers
    if not body["workers"]:
        body["status"] = "degraded"  # jobs are accepted and wait in the queue
    return jsonify(body)
