"""A job's text read back as tool calls, whole or as it streams (see common/tools.py).

`ToolCallStream` is fed the job's text in the pieces its log holds and gives events: text to show,
and calls (start, argument pieces, end). The events are a pure function of the text, so every API
process, at any time, reads the same calls with the same ids from the same log: what lets a
Responses stream be resumed by sequence number anywhere.

Text that only might begin a `<tool_call>` block is held back until it is known; whitespace before,
between and after calls is not shown; a block that does not parse as a call of an offered tool,
or is cut off by the length limit, is shown as the text it is. Nothing is ever dropped but that
whitespace.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.tools import ToolCalling

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    call_id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    delta: str


@dataclass(frozen=True)
class CallEnd:
    index: int


Event = TextPiece | CallStart | CallArguments | CallEnd


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    name: str
    arguments: str


def call_id(job_id: str, index: int) -> str:
    """The same id for the same call wherever and whenever it is read."""
    return f"call_{job_id[:20]}_{index}"


class ToolCallStream:
    def __init__(self, job_id: str, calling: ToolCalling):
        self.job_id, self.calling = job_id, calling
        self.calls: list[ToolCall] = []
        self._buffer = ""  # text not yet shown: a possible marker, a call, or a held answer
        self._blank = ""  # whitespace not yet shown (dropped if a call follows)
        self._inside = False
        self._shown = False  # some text has been shown
        self._args: list[str] = []  # the forced call's argument pieces

    def feed(self, text: str) -> list[Event]:
        if self.calling.mode == "named":
            return self._feed_named(text)
        self._buffer += text
        if self.calling.mode == "required":
            return []  # one JSON array: read whole at the end
        return self._scan(final=False)

    def finish(self) -> list[Event]:
        """The events the end of the text settles (held text, a call cut short)."""
        if self.calling.mode == "named":
            if not self.calls:  # a call with empty arguments still starts and ends
                return [*self._feed_named(""), *self._end_named()]
            return self._end_named()
        if self.calling.mode == "required":
            return self._required_calls() or self._text(self._buffer)
        return self._scan(final=True)

    # --- modes ------------------------------------------------------------------------------
    def _feed_named(self, text: str) -> list[Event]:
        events: list[Event] = []
        if not self._args and not self.calls:
            self.calls.append(ToolCall(call_id(self.job_id, 0), self.calling.forced, ""))
            events.append(CallStart(0, self.calls[0].call_id, self.calling.forced))
        if text:
            self._args.append(text)
            events.append(CallArguments(0, text))
        return events

    def _end_named(self) -> list[Event]:
        self.calls[0] = ToolCall(self.calls[0].call_id, self.calls[0].name, "".join(self._args))
        return [CallEnd(0)]

    def _required_calls(self) -> list[Event]:
        try:
            items = json.loads(self._buffer)
        except ValueError:
            return []
        if not isinstance(items, list) or not items:
            return []
        parsed = [self._as_call({"name": i.get("name"), "arguments": i.get("parameters")})
                  if isinstance(i, dict) else None for i in items]
        if any(p is None for p in parsed):
            return []
        return [e for name, arguments in parsed for e in self._call(name, arguments)]

    def _scan(self, final: bool) -> list[Event]:
        events: list[Event] = []
        while self._buffer:
            if self._inside:
                end = self._buffer.find(CLOSE)
                if end < 0 and not final:
                    break
                body = self._buffer if end < 0 else self._buffer[:end]
                self._buffer = "" if end < 0 else self._buffer[end + len(CLOSE):]
                self._inside = False
                parsed = self._as_call(_json(body))
                if parsed:
                    self._blank = ""
                    events += self._call(*parsed)
                else:
                    events += self._text(OPEN + body + ("" if end < 0 else CLOSE))
                continue
            start = self._buffer.find(OPEN)
            if start >= 0:
                events += self._text(self._buffer[:start])
                self._buffer, self._inside = self._buffer[start + len(OPEN):], True
                continue
            keep = 0 if final else _partial_marker(self._buffer)
            events += self._text(self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            break
        return events

    # --- pieces -----------------------------------------------------------------------------
    def _as_call(self, value) -> tuple[str, str] | None:
        if not isinstance(value, dict) or value.get("name") not in self.calling.names:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return value["name"], json.dumps(arguments, ensure_ascii=False)

    def _call(self, name: str, arguments: str) -> list[Event]:
        index = len(self.calls)
        self.calls.append(ToolCall(call_id(self.job_id, index), name, arguments))
        return [CallStart(index, self.calls[-1].call_id, name), CallArguments(index, arguments), CallEnd(index)]

    def _text(self, text: str) -> list[Event]:
        """Text to show. Trailing whitespace is held until text that is not whitespace follows
        it, so the same text shows the same way however it was cut into pieces; leading and
        trailing whitespace, and whitespace around calls, are never shown."""
        body = text.rstrip()
        if not body:
            self._blank += text
            return []
        shown = (self._blank + body) if self._shown else body.lstrip()
        self._blank, self._shown = text[len(body):], True
        return [TextPiece(shown)]


def _json(body: str):
    try:
        return json.loads(body.strip())
    except ValueError:
        return None


def _partial_marker(text: str) -> int:
    """How many characters at the end of `text` could be the start of `<tool_call>`."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


def read_calls(job_id: str, calling: ToolCalling, text: str) -> tuple[str | None, list[ToolCall]]:
    """The whole text as (content, calls): content None when there is only calls."""
    stream = ToolCallStream(job_id, calling)
    events = stream.feed(text) + stream.finish()
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    return (content or None) if stream.calls else content, stream.calls
