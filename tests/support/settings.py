"""Settings for tests: the test Redis (own db), a fresh key namespace each time, quick timings."""
from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from common.settings import Settings, subprocess_env
from tests.support.parallel import worker_index

REDIS_HOST = os.environ.get("LLMQ_TEST_REDIS", "redis://127.0.0.1:6379")
# Each of pytest-xdist's worker processes has a db of its own: LLMQ_TEST_REDIS_DB (11), the next...
REDIS_DB = int(os.environ.get("LLMQ_TEST_REDIS_DB", "11")) + worker_index()
# Two webhook signing secrets (a rotation in progress): every delivery carries both signatures.
WEBHOOK_SECRETS = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD")


def make_settings(**overrides) -> Settings:
    base = dict(redis_url=f"{REDIS_HOST}/{REDIS_DB}", namespace=f"llmqtest-{uuid.uuid4().hex[:8]}",
                model="embedded", allow_download=False, max_batch_size=16, max_tokens_cap=512,
                # f32: answers and seeded samples that do not depend on the host's bf16 kernels
                # (bf16 on AMD Zen 4 answers the capital of France in French) or on the batch
                dtype="float32",
                default_max_tokens=64, cache_ttl_s=600, sse_heartbeat_s=1.0, heartbeat_s=1.0,
                health_ping_timeout_s=0.5, max_queue=1000, job_ttl_s=3600,
                # webhooks to test receivers on loopback, retried quickly over a short horizon
                webhook_secrets=" ".join(WEBHOOK_SECRETS), webhook_allow_networks="127.0.0.0/8",
                webhook_timeout_s=1.0, webhook_backoff_s=0.3, webhook_backoff_max_s=2.0,
                webhook_retry_horizon_s=8.0)
    base.update(overrides)
    return Settings(**base)


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a subprocess see `settings`."""
    env = subprocess_env(settings, os.environ)
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               PYTHON=sys.executable)  # ops scripts run with the tests' Python, not a .venv of their own
    return env


def cleanup_namespace(settings: Settings) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    for key in client.scan_iter(f"{settings.namespace}*", count=1000):
        client.delete(key)


@contextmanager
def fresh_namespace(**overrides) -> Iterator[Settings]:
    """`make_settings(**overrides)`, its keys deleted when the block ends. A module's own
    `settings` fixture is usually just this (see tests/conftest.py)."""
    settings = make_settings(**overrides)
    try:
        yield settings
    finally:
        cleanup_namespace(settings)


def settings_fixture(scope: str = "module", **overrides):
    """The `settings` fixture of a module whose tests need settings of their own: a fresh
    namespace with `overrides`, deleted after the module (scope="function": one per test, for
    tests that each need an empty queue):

        settings = settings_fixture(max_queue=3)

    An override given as a function is called with pytest's `tmp_path_factory` (a file the
    settings name, which the module writes)."""
    @pytest.fixture(scope=scope, name="settings")
    def settings(tmp_path_factory):
        values = {name: value(tmp_path_factory) if callable(value) else value for name, value in overrides.items()}
        with fresh_namespace(**values) as made:
            yield made

    return settings
