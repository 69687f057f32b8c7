"""What this worker really achieves, decayed, for the API's queue ETAs (common/eta.py).

`tokens_per_s`: whole-batch generation rate over heartbeat intervals in which the worker was busy
(idle intervals say nothing about capacity and are skipped). `mean_job_tokens`: mean completion
length of the jobs it finished. Both are exponentially decayed so they follow the current load.
"""
from __future__ import annotations

import threading
import time


class LoadMeter:
    def __init__(self, rate_alpha: float = 0.5, length_alpha: float = 0.2):
        self.rate_alpha, self.length_alpha = rate_alpha, length_alpha
        self.tokens_per_s: float | None = None
        self.mean_job_tokens: float | None = None
        self._last: tuple[float, int] | None = None
        self._lock = threading.Lock()

    def observe(self, tokens_total: int, busy: bool, now: float | None = None) -> None:
        """Called each heartbeat with the engine's cumulative token count."""
        now = time.monotonic() if now is None else now
        if self._last is not None and busy and now > self._last[0]:
            rate = (tokens_total - self._last[1]) / (now - self._last[0])
            if rate > 0:
                self.tokens_per_s = self._decay(self.tokens_per_s, rate, self.rate_alpha)
        self._last = (now, tokens_total)

    def record_job(self, completion_tokens: int) -> None:
        with self._lock:
            self.mean_job_tokens = self._decay(self.mean_job_tokens, completion_tokens, self.length_alpha)

    @staticmethod
    def _decay(old: float | None, new: float, alpha: float) -> float:
        return new if old is None else (1 - alpha) * old + alpha * new

    def snapshot(self) -> dict:
        return {"tokens_per_s": self.tokens_per_s, "mean_job_tokens": self.mean_job_tokens}
