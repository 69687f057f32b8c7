"""An SSE client that follows one job's stream to its `done` as a careful client would: it
reconnects with `Last-Event-ID` when the stream breaks (Redis outage, failover), drops its text on
`restart`, and notes every chunk whose index is not the next one expected (a chunk missing or
sent twice)."""
from __future__ import annotations

import threading
import time

import requests

from common.sseclient import iter_sse


class Follower(threading.Thread):
    def __init__(self, base: str, job_id: str, timeout: float = 300):
        super().__init__(daemon=True)
        self.base, self.job_id, self.deadline = base, job_id, time.monotonic() + timeout
        self.text, self.done, self.restarts, self.reconnects = "", None, 0, 0
        self.chunks = 0
        self.out_of_order: list[tuple[int, int]] = []  # (expected index, received index)
        self.statuses: list[int] = []  # non-200 answers while reconnecting
        self.start()

    def run(self) -> None:
        last_id, expected = None, 0
        while self.done is None and time.monotonic() < self.deadline:
            try:
                headers = {"Last-Event-ID": last_id} if last_id else {}
                with requests.get(f"{self.base}/v1/jobs/{self.job_id}/events", headers=headers,
                                  stream=True, timeout=30) as resp:
                    if resp.status_code != 200:
                        self.statuses.append(resp.status_code)
                    else:
                        for event in iter_sse(resp.iter_lines()):
                            last_id = event.id or last_id
                            if event.event == "chunk":
                                chunk = event.json()
                                if chunk["index"] != expected:
                                    self.out_of_order.append((expected, chunk["index"]))
                                expected = chunk["index"] + 1
                                self.text += chunk["text"]
                                self.chunks += 1
                            elif event.event == "restart":
                                self.text, expected = "", 0
                                self.restarts += 1
                            elif event.event == "done":
                                self.done = event.json()
                                return
            except requests.RequestException:
                pass
            self.reconnects += 1
            time.sleep(0.3)
