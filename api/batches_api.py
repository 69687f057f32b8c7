"""OpenAI's Batch API (`/v1/batches`): create, retrieve, list, cancel.

The API only records the batch and schedules its first step; the control worker (worker/batch_tasks.py)
validates the input file, queues one job per line at the "batch" priority, collects results and
writes the output files. A key sees only its own batches. Errors have OpenAI's shape.
"""
from __future__ import annotations

import math
import time
from typing import Any

from flask import Blueprint, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.batch_lines import ENDPOINTS
from common.errors import ApiError
from api.files_api import file_or_404, list_page, owned_or_404, owner_id, page_limit
from api.jobs import json_body
from api.job_answers import openai_error
from api.services import services
from common.batches import CANCELLABLE, BatchStatus, batch_object, kick
from common.openai_models import Batch, BatchList
from common.webhooks import WebhookUrlError, validate_webhook_url

bp = Blueprint("batches", __name__, url_prefix="/v1/batches")


class BatchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=200)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = Field(None, max_length=16)
    output_expires_after: dict[str, Any] | None = None  # accepted; output files follow file_ttl_s
    webhook: str | None = Field(None, max_length=2048, description="URL told when the batch ends "
                                "(a signed `batch.<status>` event, as for jobs)")

    @field_validator("endpoint")
    @classmethod
    def _known_endpoint(cls, value: str) -> str:
        if value not in ENDPOINTS:
            raise ValueError(f"endpoint {value!r} is not supported; use one of {sorted(ENDPOINTS)}")
        return value

    @field_validator("completion_window")
    @classmethod
    def _24h(cls, value: str) -> str:
        if value != "24h":
            raise ValueError("completion_window must be '24h'")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (value or {}).items():
            if len(key) > 64 or len(text) > 512:
                raise ValueError("metadata keys are at most 64 characters, values at most 512")
        return value


def shown(record: dict) -> Batch:
    """The batch object, with its webhook's delivery state when it named one."""
    webhook = record.get("webhook")
    return batch_object(record, webhook and services().webhooks.view(record["id"], webhook, ["ended"]))


def batch_or_404(batch_id: str) -> dict:
    return owned_or_404(services().batches.get(batch_id), "Batch", batch_id, "batch_id")


@bp.post("")
def create():
    svc = services()
    body = BatchCreate.model_validate(json_body())
    input_file = file_or_404(body.input_file_id)
    if input_file["purpose"] != "batch":
        raise ApiError(400, "invalid_value", f"file {body.input_file_id} has purpose "
                                             f"{input_file['purpose']!r}; a batch needs purpose 'batch'",
                       param="input_file_id")
    if body.webhook is not None:  # the same address rules as a job's webhook
        try:
            validate_webhook_url(body.webhook, svc.settings)
        except WebhookUrlError as exc:
            raise ApiError(400, "invalid_value", f"webhook: {exc}", param="webhook")
    # whole seconds, as OpenAI's batch objects have them; the window rounded up, not down, so that
    # no batch gets less than its full window
    now = time.time()
    record = svc.batches.create(owner_id(), {
        "endpoint": body.endpoint, "input_file_id": body.input_file_id,
        "completion_window": body.completion_window, "metadata": body.metadata, "webhook": body.webhook,
        "created_at": int(now), "expires_at": math.ceil(now + svc.settings.batch_window_s)})
    kick(svc.redis, svc.celery, svc.keys, record["id"])  # if this fails, the watchdog will
    return jsonify(shown(record).model_dump(mode="json"))


@bp.get("/<batch_id>")
def retrieve(batch_id: str):
    return jsonify(shown(batch_or_404(batch_id)).model_dump(mode="json"))


@bp.get("")
def list_batches():
    found, has_more = services().batches.list(owner_id(), request.args.get("after"), page_limit(20, 100))
    return jsonify(list_page(BatchList, [shown(record) for record in found], has_more))


@bp.post("/<batch_id>/cancel")
def cancel(batch_id: str):
    svc = services()
    record = batch_or_404(batch_id)
    if svc.batches.transition(batch_id, CANCELLABLE, BatchStatus.CANCELLING, cancelling_at=int(time.time())):
        kick(svc.redis, svc.celery, svc.keys, batch_id)
    else:
        status = (svc.batches.get(batch_id) or record)["status"]
        if status != BatchStatus.CANCELLING:  # cancelling again is fine; an ended batch cannot be cancelled
            raise ApiError(409, "batch_not_cancellable", f"Cannot cancel a batch with status {status!r}")
    return jsonify(shown(svc.batches.get(batch_id)).model_dump(mode="json"))


@bp.errorhandler(Exception)
def _error(exc: Exception):
    return openai_error(exc)
