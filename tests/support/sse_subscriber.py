"""A thread subscribed to one job's SSE stream until its end (`common.sseclient.follow_job`),
reconnecting with `Last-Event-ID` as a client should. (Not to be confused with a coalesced
job, which the code calls a follower.)"""
from __future__ import annotations

import threading

from common.sseclient import FollowedAnswer, follow_job


class SseSubscriber(threading.Thread):
    def __init__(self, base: str, job_id: str, timeout: float = 300):
        super().__init__(daemon=True)
        self.base, self.job_id, self.timeout = base, job_id, timeout
        self.answer = FollowedAnswer()  # filled in as events arrive
        self.start()

    def run(self) -> None:
        follow_job(self.base, self.job_id, self.timeout, answer=self.answer)

    def __getattr__(self, name):  # text, done, restarts, rewinds, reconnects, chunks, out_of_order
        return getattr(self.__dict__["answer"], name)
