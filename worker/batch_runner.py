"""Moves a batch through its states, one step at a time; no Celery in here (worker/batch_tasks.py
calls it). Every step is idempotent and reads all it needs from Redis, so any process may run the
next step after any other one died, at any point (the batch's lock keeps two from running at once):

- validating: check every line of the input file (common/batch_lines.py); any error fails the batch.
  Otherwise store each line's prepared job and mark every line pending, then queue one job per
  line (fixed job ids, `line_job_id`, so a retried step finds the jobs it already made), then
  in_progress.
- in_progress: record the result of each line whose job has ended (`BatchStore.record_result`,
  exactly once per line); a job whose record is gone is queued again from its stored request.
  All lines accounted for: finalizing, then the output and error files, then completed.
- past the window (validating or in_progress): cancel the unfinished jobs, record them as
  `batch_expired`, write the files, expired.
- cancelling: cancel the unfinished jobs, record those that do not end as `batch_cancelled`
  (after `batch_cancel_grace_s` for running ones), write the files, cancelled.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from common.admission import Admission
from common.api_keys import load_keys
from common.batch_lines import ENDPOINTS, PreparedLine, check_file, result_of, stopped
from common.batches import TERMINAL, BatchStatus, line_job_id, on_batch_ended
from common.schemas import JobStatus

log = logging.getLogger(__name__)
_READ_CHUNK = 500
_ADMIT_CHUNK = 200  # lines admitted in one burst (two round trips), between checks for a cancel
_STALL_S = 30.0  # no line ended for this long while lines wait: top up their tickets
_SPARE_TICKETS = 32


class BatchRunner:
    def __init__(self, admission: Admission):
        self.admission = admission
        self.stores = admission.stores
        self.settings = admission.settings
        self.batches = self.stores.batches
        self.files = self.stores.files

    def advance(self, batch_id: str, renew: Callable[[], None] = lambda: None) -> bool:
        """Take the batch as far as it can go now; True once it has ended (or is gone)."""
        batch = self.batches.get(batch_id)
        if batch is None or batch["status"] in TERMINAL:
            self.stores.redis.srem(self.stores.keys.batches_active, batch_id)
            return True
        self.batches.update(batch_id, advanced_at=time.time())
        status = batch["status"]
        if status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS) and time.time() >= batch["expires_at"]:
            return self._stop(batch, "batch_expired", BatchStatus.EXPIRED, grace_s=0)
        if status == BatchStatus.VALIDATING:
            self._validate(batch, renew)
        elif status == BatchStatus.IN_PROGRESS:
            self._collect(batch, renew)
            if not self.batches.pending(batch_id):
                self.batches.transition(batch_id, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING,
                                        finalizing_at=int(time.time()))
        elif status == BatchStatus.CANCELLING:
            return self._stop(batch, "batch_cancelled", BatchStatus.CANCELLED, self.settings.batch_cancel_grace_s)
        status = self.batches.get(batch_id)["status"]
        if status == BatchStatus.FINALIZING:
            return self._finish(batch_id, BatchStatus.FINALIZING, BatchStatus.COMPLETED)
        return status in TERMINAL

    # --- validating ----------------------------------------------------------------------------
    def _validate(self, batch: dict, renew: Callable[[], None]) -> None:
        batch_id = batch["id"]
        content = self.files.content(batch["input_file_id"])
        if content is None:
            errors = [{"code": "input_file_missing", "line": None, "param": "input_file_id",
                       "message": f"the input file {batch['input_file_id']} was deleted or has expired"}]
            prepared = []
        else:
            prepared, errors = check_file(self.admission, content, batch["endpoint"], batch["owner"], renew)
        if errors:
            if self.batches.transition(batch_id, (BatchStatus.VALIDATING,), BatchStatus.FAILED, failed_at=int(time.time()),
                                       errors={"object": "list", "data": errors}):
                self._ended(batch_id)
            return
        self._store_lines(batch_id, prepared)
        weight = self._weight(batch["owner"])
        for start in range(0, len(prepared), _ADMIT_CHUNK):
            renew()
            if self.batches.get(batch_id)["status"] != BatchStatus.VALIDATING:
                return  # cancelled meanwhile: the cancelling step accounts for every line
            self.admission.admit_batch_lines(
                [(line_job_id(batch_id, line.line), line.fields, line.digest)
                 for line in prepared[start:start + _ADMIT_CHUNK]],
                weight=weight, queued_key=self.batches.part(batch_id, "queued"), deadline=batch["expires_at"])
        self.batches.transition(batch_id, (BatchStatus.VALIDATING,), BatchStatus.IN_PROGRESS, in_progress_at=int(time.time()))

    def _store_lines(self, batch_id: str, prepared: list[PreparedLine]) -> None:
        """Every line's prepared job and its place in `pending`, before any job is queued, so
        that whatever happens next every line is accounted for. Written once (a retry finds them)."""
        requests_key, pending_key = self.batches.part(batch_id, "requests"), self.batches.part(batch_id, "pending")
        if self.stores.redis.exists(requests_key):
            return
        ttl = self.settings.batch_ttl_s + int(self.settings.batch_window_s)
        pipe = self.stores.redis.pipeline(transaction=True)
        for start in range(0, len(prepared), _READ_CHUNK):
            part = prepared[start:start + _READ_CHUNK]
            pipe.hset(requests_key, mapping={line.line: line.dumps() for line in part})
            pipe.sadd(pending_key, *(line.line for line in part))
        pipe.expire(requests_key, ttl)
        pipe.expire(pending_key, ttl)
        pipe.hset(self.stores.keys.batch(batch_id), mapping={"total": len(prepared),
                                                          "model": prepared[0].fields["model"]})
        pipe.execute()

    def _weight(self, owner: str) -> float:
        keys = {key.id: key for key in load_keys(self.settings).values()}
        return keys[owner].weight if owner in keys else 1.0

    # --- in progress -------------------------------------------------------------------------
    def _collect(self, batch: dict, renew: Callable[[], None], ending: str | None = None) -> None:
        """Record the result of every pending line whose job has ended."""
        batch_id = batch["id"]
        _, surface = ENDPOINTS[batch["endpoint"]]
        pending = self.batches.pending(batch_id)
        queued: list[dict] = []
        recorded = False
        for start in range(0, len(pending), _READ_CHUNK):
            renew()
            lines = pending[start:start + _READ_CHUNK]
            records = self.stores.jobs.get_many([line_job_id(batch_id, line) for line in lines])
            for line, record in zip(lines, records):
                if record is None:
                    self._requeue(batch, line, ending)
                    continue
                if not record["status"].terminal:
                    if record["status"] is JobStatus.QUEUED and not record.get("coalesced_into"):
                        queued.append(record)
                    continue
                prepared = self._request(batch_id, line)
                ok, result = result_of(surface, prepared.custom_id, record, ending)
                recorded |= self.batches.record_result(batch_id, line, ok, result, record.get("prompt_tokens", 0),
                                                       record.get("completion_tokens", 0))
        if recorded:
            self.batches.update(batch_id, progress_at=time.time())
        elif queued and not ending:
            self._top_up_tickets(batch, queued)

    def _top_up_tickets(self, batch: dict, queued: list[dict]) -> None:
        """Lines are queued but none has ended for `_STALL_S`: send spare tickets. A ticket can be
        lost outside llmq's records (a broker message popped by a worker just as Redis went
        down); a spare one that finds nothing to run does nothing, so this is always safe."""
        last = max(float(batch.get(name) or 0) for name in ("progress_at", "topped_up_at", "in_progress_at"))
        if time.time() - last < _STALL_S:
            return
        log.warning("batch %s: no line ended for %.0f s; %d spare tickets", batch["id"], _STALL_S,
                    min(len(queued), _SPARE_TICKETS))
        self.batches.update(batch["id"], topped_up_at=time.time())
        for record in queued[:_SPARE_TICKETS]:
            self.admission.send_spare_ticket(record)

    def _requeue(self, batch: dict, line: int, ending: str | None) -> None:
        """A line whose job record is gone (lost with a Redis that kept no copy): queue it again,
        or, when the batch is stopping, account for it as stopped."""
        prepared = self._request(batch["id"], line)
        job_id = line_job_id(batch["id"], line)
        if ending:
            self.batches.record_result(batch["id"], line, False, stopped(job_id, prepared.custom_id, ending))
            return
        log.warning("batch %s line %d: job %s is gone; queueing it again", batch["id"], line, job_id)
        self.admission.admit_batch_line(job_id, prepared.fields, prepared.digest,
                                        weight=self._weight(batch["owner"]),
                                        queued_key=self.batches.part(batch["id"], "queued"),
                                        deadline=batch["expires_at"])

    def _request(self, batch_id: str, line: int) -> PreparedLine:
        return PreparedLine.loads(line, self.stores.redis.hget(self.batches.part(batch_id, "requests"), line))

    # --- stopping and ending -------------------------------------------------------------------
    def _stop(self, batch: dict, ending: str, final: BatchStatus, grace_s: float) -> bool:
        """Cancel the unfinished jobs; account for the lines that end or were never queued; after
        `grace_s`, account for the rest as stopped too; then write the files and end."""
        batch_id = batch["id"]
        if not batch.get("jobs_stopped"):
            for line in self.batches.pending(batch_id):
                self.stores.jobs.cancel(line_job_id(batch_id, line))
            self.batches.update(batch_id, jobs_stopped=time.time())
            batch = self.batches.get(batch_id)
        self._collect(batch, lambda: None, ending)
        if time.time() - float(batch["jobs_stopped"]) >= grace_s:
            for line in self.batches.pending(batch_id):
                job_id = line_job_id(batch_id, line)
                custom_id = self._request(batch_id, line).custom_id
                self.batches.record_result(batch_id, line, False, stopped(job_id, custom_id, ending))
        if self.batches.pending(batch_id):
            return False
        return self._finish(batch_id, batch["status"], final)

    def _finish(self, batch_id: str, current: BatchStatus, final: BatchStatus) -> bool:
        """Write the output and error files (fixed ids: a retry rewrites the same files), then
        move to `final`; the one caller that makes that change also calls `on_batch_ended`."""
        batch = self.batches.get(batch_id)
        output, errors = self.batches.results(batch_id)
        files = {}
        for kind, lines in (("output", output), ("error", errors)):
            if lines:
                file_id = f"file-{batch_id.removeprefix('batch_')}-{kind}"
                self.files.create(batch["owner"], f"{batch_id}_{kind}.jsonl", "batch_output",
                                  "".join(line + "\n" for line in lines), file_id=file_id)
                files[f"{kind}_file_id"] = file_id
        if self.batches.transition(batch_id, (current,), final, **{f"{final}_at": int(time.time())}, **files):
            self._ended(batch_id)
        return self.batches.get(batch_id)["status"] in TERMINAL  # else: cancelled meanwhile, go on

    def _ended(self, batch_id: str) -> None:
        self.batches.forget(batch_id)
        on_batch_ended(self.stores.webhooks, self.batches.get(batch_id))
