"""A real worker on the OpenVINO engine with prompt lookup on (LLMQ_PROMPT_LOOKUP): /health says
so, a streamed job's chunks join to the job's text, an OpenAI stream with a json_schema parses,
and a request asking to switch it off is refused, naming the parameter."""
from __future__ import annotations

import json

import pytest
import requests

from tests.support.jobs import chunks_text, read_stream, submit
from tests.support.servers import worker_beside_api
from tests.support.settings import make_settings
from tests.support.waiting import wait_for_job

pytest.importorskip("openvino_genai", reason="the OpenVINO engine is not installed")
pytestmark = pytest.mark.slow

TEXT = ("The river town of Elmsford sits where two valleys meet. Every spring the snowmelt swells the water, "
        "and the old stone bridge, built in 1782 by a mason named Thomas Hale, disappears for a week.")


@pytest.fixture(scope="module")
def lookup_stack(start_worker):
    settings = make_settings(engine="openvino", max_batch_size=4, kv_cache_mb=256, prompt_lookup=True,
                             prompt_lookup_tokens=5, prompt_lookup_ngram=2)
    with worker_beside_api(start_worker, settings) as (worker, url):
        yield url


def test_health_shows_the_workers_prompt_lookup(lookup_stack):
    (info,) = requests.get(f"{lookup_stack}/health", timeout=10).json()["workers_detail"]
    assert info["engine"] == "openvino" and info["prompt_lookup"] == {"tokens": 5, "ngram": 2}


def test_a_streamed_job_joins_to_its_text(lookup_stack):
    job = submit(lookup_stack, messages=[{"role": "user", "content": f"Repeat this text exactly: {TEXT}"}],
                 max_tokens=80, temperature=0, prompt_lookup=True)
    streamed = chunks_text(read_stream(lookup_stack, job["id"]))
    final = wait_for_job(lookup_stack, job["id"], timeout=120)
    assert final["status"] == "succeeded" and streamed == final["text"] and final["usage"]["completion_tokens"] > 10


def test_openai_stream_with_a_json_schema_parses(lookup_stack):
    from openai import OpenAI

    client = OpenAI(base_url=f"{lookup_stack}/v1", api_key="unused")
    schema = {"type": "object", "properties": {"town": {"type": "string"}, "year": {"type": "integer"}},
              "required": ["town", "year"], "additionalProperties": False}
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", stream=True, max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": f"{TEXT}\nAnswer in JSON: the town and the year."}],
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert set(json.loads(text)) == {"town", "year"}, text


def test_a_request_cannot_switch_it_off(lookup_stack):
    refused = requests.post(f"{lookup_stack}/v1/chat/completions", timeout=10, json={
        "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Hi"}], "prompt_lookup": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt_lookup"
