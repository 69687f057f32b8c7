"""A response's output and its numbered stream events, read from its job's log.

The events are a pure function of the log (and the record's request fields): each API process that
reads the same log numbers the same events the same way, so `GET /v1/responses/{id}?stream=true&
starting_after=N` resumes on any process at any time, and nothing is stored but the job. While the
job waits in the queue, its place goes out as SSE comments (no number), as on chat streams.

Order: `response.created`, `response.queued`, then on the first entry of the log
`response.in_progress`; the answer's text as a message item (`output_item.added`,
`content_part.added`, `output_text.delta`..., then the `.done`s), each tool call as a
`function_call` item (`output_item.added`, `function_call_arguments.delta`/`.done`,
`output_item.done`); last `response.completed`, `response.incomplete` (the length limit; or
cancelled, with the response's status saying so) or `response.failed`.

A job whose worker was lost usually continues from its log, which shows nothing here. One that
must start over (`restart` in its log) goes on unseen when nothing of its answer was shown yet (a
forced call is shown whole at its end) or when its new attempt says again what was shown (a
greedy one does); only one that says something else ends the stream with an `error` event. The
log is read with every attempt's chunks, so this too is the same on every process.
"""
from __future__ import annotations

import time

from common.openai_format import tool_calling
from common.responses_models import (ArgumentsDelta, ArgumentsDone, ContentPartEvent, FunctionCallItem,
                                     IncompleteDetails, OutputItem, OutputItemEvent, OutputMessage, OutputText,
                                     OutputTextDelta, OutputTextDone, ResponseError, ResponseEvent,
                                     ResponseObject, ResponseStatus, ResponseUsage, StreamEvent, response_status)
from common.attempts import AttemptJoin
from common.tool_parser import CallArguments, CallEnd, CallStart, TextPiece, ToolCallStream


def response_id(job_id: str) -> str:
    return f"resp_{job_id}"


def job_id_of(response_id_: str) -> str | None:
    return response_id_[5:] if response_id_.startswith("resp_") and len(response_id_) > 5 else None


def response_object(record: dict, output: list[OutputItem] | None = None,
                    status: ResponseStatus | None = None) -> ResponseObject:
    """The response for its job's record; `output` as read from the text unless given."""
    meta = record.get("response") or {}
    status = status or response_status(record)
    ended = status not in ("queued", "in_progress")
    if output is None:
        output = Output(record).read(record.get("text", ""), status, record.get("logprobs")) if ended else []
    error = record.get("error") or {}
    return ResponseObject(
        id=response_id(record["id"]), created_at=int(record["created_at"]), status=status, model=record["model"],
        completed_at=int(record["finished_at"]) if ended and record.get("finished_at") else None,
        background=meta.get("background", False), store=meta.get("store", True),
        instructions=meta.get("instructions"), output=output,
        error=ResponseError(code=error.get("type") or "server_error",
                            message=error.get("message") or f"the job ended {record['status']}")
        if status == "failed" else None,
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
        max_output_tokens=meta.get("max_output_tokens"), parallel_tool_calls=meta.get("parallel_tool_calls", True),
        previous_response_id=meta.get("previous_response_id"), temperature=meta.get("temperature"),
        top_p=meta.get("top_p"), text=meta.get("text") or {"format": {"type": "text"}},
        tool_choice=meta.get("tool_choice", "auto"), tools=meta.get("tools", []), metadata=meta.get("metadata", {}),
        top_logprobs=meta.get("top_logprobs"),
        usage=ResponseUsage.of(record) if ended else None)


class Output:
    """The output items as the job's text arrives: a message for text, an item per call."""

    def __init__(self, record: dict):
        self.job_id = record["id"]
        calling = tool_calling(record)
        self.calls = ToolCallStream(self.job_id, calling) if calling else None
        self.items: list[OutputItem] = []
        self._message: OutputMessage | None = None
        self.logprobs = bool((record.get("response") or {}).get("logprobs"))
        self._logprobs: list[dict] = []

    def feed(self, text: str, logprobs: list[dict] | None = None) -> list[dict]:
        """The events (without numbers) for the next piece of text, and its tokens' logprobs
        when they were asked for (never with tools: api/responses_api.py)."""
        pieces = self.calls.feed(text) if self.calls else [TextPiece(text)] if text else []
        if self.logprobs:  # a token that gave no text yet goes with the next text
            self._logprobs += logprobs or []
        return [e for piece in pieces for e in self._on(piece)]

    def finish(self, status: ResponseStatus) -> list[dict]:
        """The events that close what is open once the text has ended."""
        events = [e for piece in (self.calls.finish() if self.calls else []) for e in self._on(piece)]
        item_status = "completed" if status == "completed" else "incomplete"
        if self._message and self._logprobs:  # the last tokens gave no text of their own
            self._message.content[0].logprobs += self._logprobs
        self._logprobs = []
        events += self._close_message(item_status)
        for i, item in enumerate(self.items):
            if item.status == "in_progress":  # a forced call cut short
                self.items[i] = item.model_copy(update={"status": item_status})
        return events

    def read(self, text: str, status: ResponseStatus, logprobs: list[dict] | None = None) -> list[OutputItem]:
        self.feed(text, logprobs)
        self.finish(status)
        return self.items

    def _on(self, piece) -> list[dict]:
        if isinstance(piece, TextPiece):
            events = [] if self._message else self._open_message()
            part = self._message.content[0]
            part.text += piece.text
            taken, self._logprobs = self._logprobs, []
            part.logprobs += taken
            return events + [dict(cls=OutputTextDelta, item_id=self._message.id, output_index=self._index(),
                                  delta=piece.text, logprobs=taken)]
        if isinstance(piece, CallStart):
            events = self._close_message("completed")
            item = FunctionCallItem(id=f"fc_{self.job_id[:24]}_{len(self.items)}", call_id=piece.call_id,
                                    name=piece.name, arguments="", status="in_progress")
            self.items.append(item)
            return events + [dict(cls=OutputItemEvent, type="response.output_item.added",
                                  output_index=self._index(), item=item.model_copy())]
        item = self.items[-1]
        if isinstance(piece, CallArguments):
            item.arguments += piece.delta
            return [dict(cls=ArgumentsDelta, item_id=item.id, output_index=self._index(), delta=piece.delta)]
        assert isinstance(piece, CallEnd)
        item.status = "completed"
        return [dict(cls=ArgumentsDone, item_id=item.id, output_index=self._index(), name=item.name,
                     arguments=item.arguments),
                dict(cls=OutputItemEvent, type="response.output_item.done", output_index=self._index(),
                     item=item.model_copy())]

    def _open_message(self) -> list[dict]:
        self._message = OutputMessage(id=f"msg_{self.job_id[:24]}_{len(self.items)}", status="in_progress",
                                      content=[OutputText(text="")])
        self.items.append(self._message)
        empty = self._message.model_copy(update={"content": []})
        return [dict(cls=OutputItemEvent, type="response.output_item.added", output_index=self._index(), item=empty),
                dict(cls=ContentPartEvent, type="response.content_part.added", item_id=self._message.id,
                     output_index=self._index(), part=OutputText(text=""))]

    def _close_message(self, status: str) -> list[dict]:
        message, self._message = self._message, None
        if message is None:
            return []
        index = self.items.index(message)
        message.status = status
        part = message.content[0]
        return [dict(cls=OutputTextDone, item_id=message.id, output_index=index, text=part.text,
                     logprobs=part.logprobs),
                dict(cls=ContentPartEvent, type="response.content_part.done", item_id=message.id,
                     output_index=index, part=part.model_copy()),
                dict(cls=OutputItemEvent, type="response.output_item.done", output_index=index,
                     item=message.model_copy(deep=True))]

    def _index(self) -> int:
        return len(self.items) - 1


class ResponseStream:
    """Numbers the events of one response, from its record and the entries of its log."""

    def __init__(self, record: dict):
        self.record = record
        self.output = Output(record)
        self._next = 0
        self._started = False
        self.attempts = AttemptJoin()  # a job that had to start over, as one text

    def opening(self) -> list[StreamEvent]:
        queued = response_object(self.record, output=[], status="queued")
        return [self._number(dict(cls=ResponseEvent, type="response.created", response=queued)),
                self._number(dict(cls=ResponseEvent, type="response.queued", response=queued))]

    def on_chunk(self, text: str, logprobs: list[dict] | None = None) -> list[StreamEvent]:
        new = self.attempts.take(text, logprobs)
        if new is None:
            return []  # the new attempt says again what was sent (or has diverged)
        text, logprobs = new
        return self._start() + [self._number(e) for e in self.output.feed(text, logprobs)]

    @property
    def diverged(self) -> bool:
        return self.attempts.diverged

    def on_restart(self) -> list[StreamEvent]:
        """The job's worker was lost and its job started over (it could not be continued: see
        docs/reliability.md). Nothing of the answer shown yet: the new attempt simply goes on.
        Else the new attempt's text must first say again what was sent (a greedy answer does),
        and only what it adds is shown; one that says something else sets `diverged`."""
        shown = bool(self.output.items)
        self.attempts.restart(shown)
        if not shown:
            self.output = Output(self.record)
        return []

    def on_done(self, record: dict) -> list[StreamEvent]:
        """The closing events; `record` is the job's once it has ended."""
        self.attempts.end()
        if self.diverged:
            return []
        status = response_status(record)
        events = self._start() + [self._number(e) for e in self.output.finish(status)]
        final = response_object(record, output=self.output.items, status=status)
        kind = {"completed": "response.completed", "failed": "response.failed"}.get(status, "response.incomplete")
        return events + [self._number(dict(cls=ResponseEvent, type=kind, response=final))]

    def _start(self) -> list[StreamEvent]:
        if self._started:
            return []
        self._started = True
        running = response_object({**self.record, "started_at": time.time()}, output=[], status="in_progress")
        return [self._number(dict(cls=ResponseEvent, type="response.in_progress", response=running))]

    def _number(self, event: dict) -> StreamEvent:
        cls = event.pop("cls")
        numbered = cls(sequence_number=self._next, **event)
        self._next += 1
        return numbered
