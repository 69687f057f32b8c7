"""A small Server-Sent Events reader for llmq's streams (demo client, tests, benchmark)."""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass
class SSEEvent:
    id: str | None
    event: str
    data: str

    def json(self):
        return json.loads(self.data)


def iter_sse(lines: Iterable[str | bytes]) -> Iterator[SSEEvent]:
    """Parse an SSE byte/line stream (e.g. `requests.Response.iter_lines()`); comments skipped."""
    event_id, event, data = None, "message", []
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode()
        if line == "":
            if data:
                yield SSEEvent(event_id, event, "\n".join(data))
            event_id, event, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                event_id = value
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)
