"""What this worker really achieves, decayed, for the API's queue ETAs (common/eta.py).

`tokens_per_s`: whole-batch generation rate over heartbeat intervals in which the worker was busy
(idle intervals say nothing about capacity and are skipped). `sequence_tokens_per_s`: engine steps
per second over the same intervals, which is the rate one running sequence gets. `mean_job_tokens`: mean completion
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
        self.sequence_tokens_per_s: float | None = None
        self._last: tuple[float, int, int] | None = None
        self._lock = threading.Lock()

    def observe(self, tokens_total: int, busy: bool, now: float | None = None, steps_total: int = 0) -> None:
        """Called each heartbeat with the engine's cumulative token and step counts."""
        now = time.monotonic() if now is None else now
        if self._last is not None and busy and now > self._last[0]:
            elapsed = now - self._last[0]
            rate = (tokens_total - self._last[1]) / elapsed
            steps = (steps_total - self._last[2]) / elapsed
            if rate > 0:
                self.tokens_per_s = self._decay(self.tokens_per_s, rate, self.rate_alpha)
            if steps > 0:
                self.sequence_tokens_per_s = self._decay(self.sequence_tokens_per_s, steps, self.rate_alpha)
        self._last = (now, tokens_total, steps_total)

    def record_job(self, completion_tokens: int) -> None:
        with self._lock:
            self.mean_job_tokens = self._decay(self.mean_job_tokens, completion_tokens, self.length_alpha)

    @staticmethod
    def _decay(old: float | None, new: float, alpha: float) -> float:
        return new if old is None else (1 - alpha) * old + alpha * new

    def snapshot(self) -> dict:
        return {"tokens_per_s": self.tokens_per_s, "mean_job_tokens": self.mean_job_tokens,
                "sequence_tokens_per_s": self.sequence_tokens_per_s}
