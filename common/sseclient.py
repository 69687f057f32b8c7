"""A small Server-Sent Events reader for llmq's streams (demo client, tests, benchmark)."""
from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass


@dataclass
class SSEEvent:
    id: str | None
    event: str
    data: str

    def json(self):
        return json.loads(self.data)


def iter_sse(lines: Iterable[str | bytes], comments: bool = False) -> Iterator[SSEEvent]:
    """Parse an SSE byte/line stream (e.g. `requests.Response.iter_lines()`); comments skipped, or
    with `comments` yielded as events named ":" (the OpenAI stream's places in line)."""
    event_id, event, data = None, "message", []
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode()
        if line == "":
            if data:
                yield SSEEvent(event_id, event, "\n".join(data))
            event_id, event, data = None, "message", []
        elif line.startswith(":"):
            if comments:
                yield SSEEvent(None, ":", line[1:].lstrip())
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                event_id = value
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)


async def aiter_sse(lines: AsyncIterable[bytes]) -> AsyncIterator[SSEEvent]:
    """`iter_sse` over an async stream of lines (aiohttp's `response.content`)."""
    block = []
    async for line in lines:
        block.append(line.rstrip(b"\r\n"))
        if not block[-1]:
            for event in iter_sse(block):
                yield event
            block = []


@dataclass
class FollowedAnswer:
    """What a careful client ends with after following a job's stream (see `follow_job`)."""
    text: str = ""
    done: dict | None = None
    restarts: int = 0
    rewinds: int = 0  # chunks that replaced chunks received before (see `follow_job`)
    reconnects: int = 0
    chunks: int = 0
    out_of_order: list = None  # (expected index, received index): a chunk missing
    statuses: list = None  # non-200 answers met while reconnecting (503 during a Redis switch)
    starts: list = None  # where each chunk received begins in `text`, by index

    def __post_init__(self):
        self.out_of_order, self.statuses, self.starts = [], [], []

    def add_chunk(self, index: int, text: str) -> None:
        """A chunk takes its place by its index: the next one is appended; one whose index was
        received already replaces it and what followed it (a Redis failover lost the log's end
        that this client had, and the job went on from the log: docs/reliability.md); one
        beyond the next is noted as a gap."""
        if index < len(self.starts):
            self.text, self.starts = self.text[:self.starts[index]], self.starts[:index]
            self.rewinds += 1
        elif index > len(self.starts):
            self.out_of_order.append((len(self.starts), index))
            self.starts += [len(self.text)] * (index - len(self.starts))
        self.starts.append(len(self.text))
        self.text += text
        self.chunks += 1


def follow_job(base: str, job_id: str, timeout: float = 300, answer: FollowedAnswer | None = None,
               stop_after_chunks: int | None = None) -> FollowedAnswer:
    """Follow a job's SSE stream to its `done` as a client should: reconnect with `Last-Event-ID`
    when the stream breaks (Redis outage or failover), drop the text on `restart`, and put each
    chunk where its index says (`FollowedAnswer.add_chunk`). `answer` (if given) is filled in as
    events arrive, so another thread can watch progress; `stop_after_chunks` drops the connection
    early."""
    import time

    import requests

    answer = answer or FollowedAnswer()
    last_id, deadline = None, time.monotonic() + timeout
    while answer.done is None and time.monotonic() < deadline:
        try:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            with requests.get(f"{base}/v1/jobs/{job_id}/events", headers=headers, stream=True,
                              timeout=(10, 60)) as resp:
                if resp.status_code != 200:
                    answer.statuses.append(resp.status_code)
                else:
                    for event in iter_sse(resp.iter_lines()):
                        last_id = event.id or last_id
                        if event.event == "chunk":
                            chunk = event.json()
                            answer.add_chunk(chunk["index"], chunk["text"])
                            if stop_after_chunks and answer.chunks == stop_after_chunks:
                                break  # a client that drops the connection mid-stream
                        elif event.event == "restart":
                            answer.text, answer.starts = "", []
                            answer.restarts += 1
                        elif event.event == "done":
                            answer.done = event.json()
                            return answer
        except requests.RequestException:
            pass
        answer.reconnects += 1
        time.sleep(0.3)
    return answer
