"""The one Redis retry policy (common/redis_retry.py): waits that double up to a cap, and a bound
on the whole outage after which the error is the caller's. Driven on a fake clock."""
from __future__ import annotations

import pytest
import redis

from common import redis_retry
from common.redis_retry import MAX_DELAY_S, Backoff, retrying


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(redis_retry, "time", clock)
    return clock


def failing(times: int):
    """A call that fails like an unreachable Redis `times` times, then answers."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise redis.ConnectionError("Connection refused")
        return "answered"
    return call


def test_waits_double_up_to_the_cap_and_start_short_again_after_a_reset():
    backoff = Backoff(first_s=0.1)
    assert [backoff.next() for _ in range(7)] == [0.1, 0.2, 0.4, 0.8, 1.6, MAX_DELAY_S, MAX_DELAY_S]
    backoff.reset()
    assert backoff.next() == 0.1


def test_a_call_is_retried_through_an_outage_shorter_than_the_bound(clock):
    assert retrying(failing(4), within_s=60) == "answered"
    assert clock.slept == [0.2, 0.4, 0.8, 1.6]


def test_an_outage_longer_than_the_bound_raises_once_the_next_wait_would_pass_it(clock):
    with pytest.raises(redis.ConnectionError):
        retrying(failing(100), within_s=5)
    assert sum(clock.slept) <= 5 and sum(clock.slept) + MAX_DELAY_S > 5


def test_errors_other_than_redis_ones_are_not_retried(clock):
    def broken():
        raise ValueError("a bug, not an outage")
    with pytest.raises(ValueError):
        retrying(broken, within_s=60)
    assert clock.slept == []
