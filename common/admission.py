"""Admission: a validated request becomes a cached answer or a queued job.

One home for the checks and steps every way in shares: the jobs API, the OpenAI-compatible
endpoints and each line of a batch (the control worker runs those). It knows nothing of HTTP or of
who is asking: the caller passes the owner, priority and weight it has established, and gets an
`ApiError` (common/errors.py) for a request that cannot be admitted.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import ContextManager, NamedTuple

from common.catalog import Catalog
from common.errors import ApiError
from common.eta import WorkerLoad, retry_after
from common.models import ModelRef, ModelUnavailable
from common.new_jobs import Created, NewJob
from common.scheduling.prefix_affinity import prefix_blocks
from common.prompting import PromptBuilder, TemplateError
from common.schemas import JobRequest, JobStatus
from common.settings import Settings
from common.stores import Stores
from common.tickets import Tickets
from common.webhooks import DEFAULT_JOB_EVENTS, WebhookUrlError, validate_webhook_url


class Admitted(NamedTuple):
    """What `Admission.submit` did: the HTTP status (200 answered from the cache, 202 queued),
    the job's record, and, when asked for, the queued jobs ahead of it."""
    status: int
    record: dict
    ahead: int | None = None


class Admission:
    def __init__(self, stores: Stores):
        self.stores = stores
        self.settings = stores.settings
        self.jobs = stores.jobs
        self.cache = stores.cache
        self._lock = threading.Lock()
        self.catalog = Catalog.from_settings(self.settings)
        self._models: dict[str | None, tuple[ModelRef, PromptBuilder, Settings]] = {}
        self._swept_at = 0.0
        self.tickets = Tickets(self.settings, stores.keys, stores.celery)

    def model(self, name: str | None = None) -> tuple[ModelRef, PromptBuilder]:
        """The catalog model a request names (None: the default) and its prompt builder: 404 for a
        model not in the catalog, 503 until it has been prepared on disk (its tokenizer is read
        here; its weights only by workers). A catalog model no worker holds yet is served: its
        jobs wait in its queue until a worker loads it."""
        ref, builder, _ = self._model(name)
        return ref, builder

    def served_models(self) -> list[str]:
        """The names of the catalog's models (without a catalog file: the one model, once it is
        prepared on disk; none before)."""
        if self.catalog.named:
            return list(self.catalog.models)
        try:
            return [self.model()[0].name]
        except ApiError:
            return []

    def _model(self, name: str | None) -> tuple[ModelRef, PromptBuilder, Settings]:
        """`model`, with the settings it is served with (a catalog entry may set its own limits)."""
        entry = self.catalog.get(name)
        if entry is None:
            raise ApiError(404, "model_not_found", f"model {name!r} is not served here; this deployment "
                                                   f"serves {sorted(self.catalog.models)}")
        with self._lock:
            if entry.name not in self._models:
                try:
                    ref = entry.resolve(self.settings)
                except ModelUnavailable as exc:
                    raise ApiError(503, "model_unavailable", str(exc), {"Retry-After": "10"})
                settings = entry.settings(self.settings)
                self._models[entry.name] = (ref, PromptBuilder(ref.path, settings.max_model_len), settings)
            ref, builder, settings = self._models[entry.name]
        if name not in (None, ref.name):  # without a catalog file: the one model, by its own name
            raise ApiError(404, "model_not_found", f"model {name!r} is not served here; "
                                                   f"this deployment serves {ref.name!r}")
        return ref, builder, settings

    def submit(self, req: JobRequest, *, owner: str | None, priority: str, weight: float = 1.0,
               webhook: dict | None = None, extra: dict | None = None, place: bool = False,
               hold: Callable[[str], ContextManager] = lambda job_id: contextlib.nullcontext(),
               job_id: str | None = None) -> Admitted:
        """200 and the job record for a cache hit, 202 and the record for a queued job (with
        `place`, the jobs ahead of it as it was queued). `webhook` comes from `webhook_fields`;
        `extra`, more fields for the record (a response's own: common/responses_request.py);
        `hold(job_id)` is held while the job is created with its ticket (the API's per-key
        concurrency slot). `job_id`: the new job's id, where the caller needs it before the job
        exists (a random one otherwise). A new job, its ticket and its place are one round trip to
        Redis."""
        fields, digest = self.prepare(req, owner, priority, job_id)
        fields.update(webhook or {})
        fields.update(extra or {})
        answered = self._answer_from_cache(fields, digest)
        if answered is not None:
            return Admitted(200, answered)

        fields.update(status=JobStatus.QUEUED, cache_key=digest,
                      **self._deadlines(req, fields["created_at"]))
        job_id = fields["id"]
        coalesce = digest if self.settings.coalesce else None
        self.sweep_expired()
        with hold(job_id):
            if coalesce and self.jobs.attach(job_id, fields, coalesce):
                return Admitted(202, self.jobs.get(job_id))  # rides on an identical queued or running job

            def create() -> Created | None:
                return self.jobs.create(job_id, fields, self.settings.max_queue, weight=weight, digest=coalesce,
                                         ticket=self.tickets.for_job(job_id, fields["model"], fields["queue"]),
                                         place=place)
            # a full queue may be full of jobs past their deadline: they leave it, and we count again
            created = create() or (self.jobs.sweep_expired() and create())
            if not created:
                raise ApiError(429, "queue_full", f"{self.settings.max_queue} jobs are already waiting; "
                                                  "retry later", {"Retry-After": str(self.retry_after())})
        return Admitted(202, created.record, created.ahead)

    def prepare(self, req: JobRequest, owner: str | None, priority: str,
                job_id: str | None = None) -> tuple[dict, str | None]:
        """Everything a job record needs from a validated request: the model check, the prompt's
        tokens, sampling within the context (ApiError otherwise). Returns (fields, digest); the
        digest names identical requests, for the result cache and for coalescing (None: not
        deterministic or cache off). `job_id`: the job's id (a random one when not given)."""
        model, builder, settings = self._model(req.model)
        _check_prompt_lookup(req.prompt_lookup, settings, model.name)
        messages = [m.model_dump(exclude_none=True) for m in req.messages] if req.messages else None
        calling = req.tool_calling()
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if calling else None
        try:
            _, prompt_ids = builder.build(messages, req.prompt, tools)  # long text is encoded off the loop
        except TemplateError as exc:
            raise ApiError(422, "validation_error", f"messages: {exc}")
        sampling = _sampling_within_context(req, len(prompt_ids), builder.context_length, settings)
        if calling and calling.mode != "auto":  # the call is forced: its JSON is enforced
            schema = calling.output_schema(req.tools, req.parallel_tool_calls is not False)
            sampling["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "tool_call", "schema": schema, "strict": True}}
        digest = _cache_key(model.name, prompt_ids, sampling) if req.cache and req.deterministic else None
        fields = {
            "id": job_id or uuid.uuid4().hex, "model": model.name, "created_at": time.time(),
            "prompt_tokens": len(prompt_ids), "queue": self.stores.keys.queue(model.name),
            "prefix_blocks": prefix_blocks(prompt_ids),  # where its start is cached (common/scheduling/prefix_affinity.py)
            "request": {"prompt_token_ids": prompt_ids, "sampling": sampling},
            "owner": owner, "priority": priority,
            "max_tokens": sampling["max_tokens"],  # read on its own by the ETAs (common/eta.py)
            "tool_calling": calling.model_dump() if calling else None,  # to read calls from its text
        }
        return fields, digest

    def webhook_fields(self, req: JobRequest) -> dict:
        """The job record's webhook fields, once the URL is known to be allowed (a 422 naming the
        field otherwise; the OpenAI endpoints answer it as a 400 with `param`)."""
        if req.webhook is None:
            return {}
        try:
            url = validate_webhook_url(req.webhook, self.settings)
        except WebhookUrlError as exc:
            raise ApiError(422, "validation_error", f"webhook: {exc}", param="webhook",
                           details=[{"field": "webhook", "message": str(exc)}])
        events = list(dict.fromkeys(req.webhook_events or DEFAULT_JOB_EVENTS))
        return {"webhook": url, "webhook_events": ",".join(events)}

    def admit_batch_line(self, job_id: str, fields: dict, digest: str | None, *,
                         weight: float, queued_key: str, deadline: float) -> None:
        """Admit one line of a batch as job `job_id` (see common/batches.py): like `submit`
        (cache, coalescing, the fair queue, the same workers) but at the "batch" level, outside the
        interactive admission bound and per-key limits, and never as the job others coalesce onto
        (an interactive request must not wait at batch priority). Idempotent: a job that exists is
        left as it is, except that a queued one gets a spare ticket (harmless: a ticket that finds
        nothing to run does nothing)."""
        self.admit_batch_lines([(job_id, fields, digest)], weight=weight, queued_key=queued_key, deadline=deadline)

    def admit_batch_lines(self, lines: list[tuple[str, dict, str | None]], *,
                          weight: float, queued_key: str, deadline: float) -> None:
        """`admit_batch_line` of each (job id, fields, digest), as a burst: the lines' records are
        read in one round trip and the new jobs created, with their tickets, in one more."""
        new: list[NewJob] = []
        for (job_id, fields, digest), record in zip(lines, self.jobs.get_many([line[0] for line in lines])):
            if record is not None:
                if record.get("status") == JobStatus.QUEUED and not record.get("coalesced_into"):
                    self.send_spare_ticket(record)
                continue
            fields = {**fields, "id": job_id, "created_at": time.time(), "priority": "batch"}
            if self._answer_from_cache(fields, digest) is not None:
                continue
            fields.update(status=JobStatus.QUEUED, cache_key=digest, queue_deadline=deadline,
                          run_timeout_s=self.settings.run_timeout_s or None)
            if digest and self.settings.coalesce and self.jobs.attach(job_id, fields, digest):
                continue
            ticket = self.tickets.for_job(job_id, fields["model"], fields["queue"], spare=True)
            new.append(NewJob(job_id, fields, weight, ticket=ticket))
        if new:
            self.jobs.create_many(new, 0, queued_key)

    def send_spare_ticket(self, record: dict) -> None:
        """One more ticket for a queued job's model queue (a spare one: see `Tickets.for_job`)."""
        self.tickets.send_spare(self.stores.redis, record["id"], record["model"], record["queue"])

    def sweep_expired(self) -> None:
        """Expire queued jobs past their deadline, at most once a second per process: a burst of
        thousands of submissions needs one sweep, not one each (workers sweep on their own too)."""
        now = time.monotonic()
        if now - self._swept_at >= 1.0:
            self._swept_at = now
            self.jobs.sweep_expired()

    def retry_after(self) -> int:
        """Seconds until the full queue has room again, at the rate the workers measure."""
        excess = max(self.jobs.queue_depth() - self.settings.max_queue, 0)
        return retry_after(excess, [WorkerLoad.from_heartbeat(w) for w in self.stores.registry.live()])

    def _deadlines(self, req: JobRequest, now: float) -> dict:
        """The job's queue deadline (epoch s) and run limit (s): the request may only shorten the
        server's limits (0 there: none)."""
        queue_s = min(filter(None, (req.queue_timeout, self.settings.queue_timeout_s)), default=None)
        run_s = min(filter(None, (req.run_timeout, self.settings.run_timeout_s)), default=None)
        return {"queue_deadline": now + queue_s if queue_s else None, "run_timeout_s": run_s}

    def _answer_from_cache(self, fields: dict, digest: str | None) -> dict | None:
        """The job, created already answered, when the result cache has this request's answer;
        None otherwise (not deterministic, cache off, or a miss)."""
        hit = self.cache.get(digest) if digest and self.cache.enabled else None
        if hit is None:
            return None
        now = time.time()
        fields.update(status=JobStatus.SUCCEEDED, cached=True, started_at=now, finished_at=now,
                      text=hit["text"], finish_reason=hit["finish_reason"],
                      completion_tokens=hit["completion_tokens"], logprobs=hit.get("logprobs"))
        job_id = fields["id"]
        self.jobs.create_finished(job_id, fields)
        chunk = {"index": 0, "text": hit["text"]}
        if hit.get("logprobs") is not None:  # a request asking for logprobs has its own digest
            chunk["logprobs"] = hit["logprobs"]
        self.stores.token_log.append_event(job_id, "chunk", chunk)
        self.stores.token_log.publish_done(job_id)
        return self.jobs.get(job_id)


def _cache_key(model: str, prompt_ids: list[int], sampling: dict) -> str:
    blob = json.dumps({"model": model, "prompt": prompt_ids, "sampling": sampling}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _check_prompt_lookup(asked: bool | None, settings: Settings, model: str) -> None:
    """A request may name the model's own prompt-lookup setting, never another: the OpenVINO and
    vLLM engines build n-gram drafting into the pipeline, which then drafts for every request
    (OpenVINO's even refuses a request that does not), so a request cannot switch it (400)."""
    if asked is None or asked == settings.prompt_lookup:
        return
    state = "on" if settings.prompt_lookup else "off"
    raise ApiError(400, "unsupported_parameter",
                   f"prompt_lookup={str(asked).lower()}: model {model!r} is served with prompt lookup {state} "
                   f"(LLMQ_PROMPT_LOOKUP or its catalog entry); the engines set it per model, not per request",
                   param="prompt_lookup")


def _sampling_within_context(req: JobRequest, prompt_tokens: int, context: int, settings: Settings) -> dict:
    """The request's sampling, its max_tokens within the model's context and limits (ApiError otherwise)."""
    if req.max_tokens > settings.max_tokens_cap:
        raise ApiError(422, "validation_error",
                       f"max_tokens: at most {settings.max_tokens_cap} (got {req.max_tokens})")
    room = context - prompt_tokens
    if room < 1:
        raise ApiError(413, "context_length_exceeded",
                       f"the prompt has {prompt_tokens} tokens; the model's context is {context}")
    max_tokens = req.max_tokens if "max_tokens" in req.model_fields_set else settings.default_max_tokens
    if max_tokens > room:
        if "max_tokens" in req.model_fields_set:
            raise ApiError(413, "context_length_exceeded",
                           f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
                           f"model's context of {context}; lower max_tokens to {room} or less")
        max_tokens = room
    sampling = req.sampling().model_dump()
    sampling["max_tokens"] = max_tokens
    return sampling
