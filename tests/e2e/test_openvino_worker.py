"""A real worker on the OpenVINO engine (the CPU default), end to end: what it reports, an OpenAI
stream with a json_schema, kill -9 (its core process goes too, and the job is redelivered), and a
SIGTERM to all its processes (the running job finishes first).
The rest of the end-to-end suite (SSE resume, cancel, coalescing...) runs on this engine too,
since it is the default wherever openvino-genai is installed."""
from __future__ import annotations

import json
import signal

import pytest
import requests

from tests.support.jobs import submit
from tests.support.logprobs import check_chat_logprobs
from tests.support.processes import kill_9_mid_job
from tests.support.servers import worker_beside_api
from tests.support.settings import make_settings
from tests.support.waiting import wait_for_job, wait_until

pytest.importorskip("openvino_genai", reason="the OpenVINO engine is not installed")
pytestmark = pytest.mark.slow

COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 400, "temperature": 0, "cache": False}


@pytest.fixture(scope="module")
def ov_stack(start_worker):
    settings = make_settings(engine="auto", max_batch_size=4, kv_cache_mb=256, visibility_timeout_s=4,
                             broker_restore_interval_s=1)
    with worker_beside_api(start_worker, settings) as (worker, url):
        yield settings, worker, url


def test_auto_picks_openvino_on_a_cpu_and_health_says_so(ov_stack):
    _, worker, url = ov_stack
    (info,) = requests.get(f"{url}/health", timeout=10).json()["workers_detail"]
    assert info["engine"] == "openvino" and info["weights"] == "int8" and info["pid"] == worker.proc.pid
    assert info["kv_capacity_tokens"] > 1000 and info["prefix_caching"] is True
    assert info["dtype"] in ("bfloat16", "float32", "float16")


def test_openai_stream_with_a_json_schema_parses(ov_stack):
    from openai import OpenAI

    _, _, url = ov_stack
    client = OpenAI(base_url=f"{url}/v1", api_key="unused")
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", stream=True, max_tokens=80, temperature=0,
        messages=[{"role": "user", "content": "Name a famous city and its country."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop", text
    assert set(json.loads(text)) == {"city", "country"}


def test_logprobs_are_the_chosen_tokens_only_and_alternatives_are_400(ov_stack):
    from openai import BadRequestError, OpenAI

    _, _, url = ov_stack
    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    check_chat_logprobs(client, "SmolLM2-135M-Instruct", top=0)
    with pytest.raises(BadRequestError, match="openvino engine computes at most 0 top_logprobs") as refused:
        check_chat_logprobs(client, "SmolLM2-135M-Instruct", top=2)
    assert refused.value.body["param"] == "top_logprobs"


def test_kill_9_leaves_no_core_process_and_the_job_is_redelivered(ov_stack, start_worker):
    settings, worker, url = ov_stack
    job = submit(url, **COUNTING)
    kill_9_mid_job(url, worker, job["id"])

    other = start_worker(settings)  # the next worker takes the job over
    final = wait_for_job(url, job["id"], timeout=300)
    assert final["status"] == "succeeded" and final["attempts"] == 2, final
    other.stop()  # the next test's job must go to the worker it stops, not to this one


def test_sigterm_to_the_worker_and_its_core_lets_the_running_job_finish(ov_stack, start_worker):
    """What a process manager does to stop a worker (compose, systemd, Ctrl-C): SIGTERM to every
    process of it. The core rides it out, the worker's warm shutdown finishes the running job, and
    the worker exits cleanly, taking its core with it (no false 'core died' exit)."""
    import psutil

    settings, _, url = ov_stack
    worker = start_worker(settings)
    job = submit(url, **COUNTING)
    wait_until(lambda: requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()["text"] != "", 120,
               interval=0.1, message="the job did not start")
    everyone = [psutil.Process(worker.proc.pid), *psutil.Process(worker.proc.pid).children(recursive=True)]
    for process in everyone:
        process.send_signal(signal.SIGTERM)
    assert worker.proc.wait(120) == 0, worker.log_path.read_text()[-3000:]
    _, alive = psutil.wait_procs(everyone, timeout=20)
    assert not alive
    final = requests.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()
    assert final["status"] == "succeeded" and final["attempts"] == 1, final
    assert "CRITICAL" not in worker.log_path.read_text()
