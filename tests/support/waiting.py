"""Waiting for a condition instead of sleeping for it."""
from __future__ import annotations

import time
from collections.abc import Callable

import requests


def wait_until(predicate: Callable[[], object], timeout: float = 10, *, interval: float = 0.01,
               ignoring: tuple[type[BaseException], ...] = (),
               message: str | Callable[[], str] = "timed out") -> None:
    """Poll `predicate` every `interval` seconds until it holds; fail the test after `timeout`
    seconds with `message` (or what it returns). An exception in `ignoring` (a server still
    starting) counts as "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except ignoring:
            pass
        if time.monotonic() >= deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(interval)


def wait_for_job(base_url: str, job_id: str, timeout: float = 120) -> dict:
    """The job's record once it has ended, read from the jobs API at `base_url`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = requests.get(f"{base_url}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} still {job['status']}")
