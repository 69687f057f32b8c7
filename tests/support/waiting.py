"""Waiting for a condition instead of sleeping for it."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import requests

T = TypeVar("T")


FIRST_INTERVAL_S, LONGEST_INTERVAL_S = 0.01, 0.1  # polls without an interval of their own: see wait_until


def wait_until(predicate: Callable[[], T], timeout: float = 10, *, interval: float | None = None,
               ignoring: tuple[type[BaseException], ...] = (),
               message: str | Callable[[], str] = "timed out") -> T:
    """Poll `predicate` until it holds, and return what it returned (a record, once it has
    ended); fail the test after `timeout` seconds with `message` (or what it returns). An
    exception in `ignoring` (a server still starting) counts as "not yet". Polls come every
    `interval` seconds, or, without one, every 10 ms at first and then less often, up to every
    0.1 s: a condition that holds soon is seen at once, and a long wait (a worker starting) does
    not spend a core on requests that take it from the very processes being waited for."""
    deadline = time.monotonic() + timeout
    pause = FIRST_INTERVAL_S if interval is None else interval
    while True:
        try:
            if value := predicate():
                return value
        except ignoring:
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(pause)
        if interval is None:
            pause = min(pause * 1.5, LONGEST_INTERVAL_S)


def wait_for_job(base_url: str, job_id: str, timeout: float = 120) -> dict:
    """The job's record once it has ended, read from the jobs API at `base_url`."""
    def ended() -> dict | None:
        job = requests.get(f"{base_url}/v1/jobs/{job_id}", timeout=10).json()
        return job if job["status"] not in ("queued", "running") else None
    return wait_until(ended, timeout, interval=0.1, message=f"job {job_id} did not end")
