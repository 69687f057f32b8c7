"""One streamed request as its client sees it (`Sample`), over each API a benchmark drives:
llmq's jobs API, the baseline's `/generate`, OpenAI chat completions and responses.

Every request function has the shape `(url, prompt, max_tokens) -> Sample`, so the load drivers
(bench/harness/load.py) run any of them."""
from __future__ import annotations

import time
from dataclasses import dataclass

import requests

from common.sseclient import iter_sse

RESPONSE_ENDS = ("response.completed", "response.incomplete", "response.failed")


@dataclass
class Sample:
    ok: bool
    ttft: float = 0.0  # seconds from sending to the first text (or to the end of an answer with none)
    latency: float = 0.0  # seconds from sending to the end
    tokens: int = 0  # completion tokens
    answer_id: str = ""  # the server's id of the answer (an OpenAI chat completion's `id`)


def read_job_events(resp: requests.Response, t0: float) -> Sample:
    """A job's event stream (llmq's `chunk` and `done` events; the baseline's too) to its end."""
    sample = Sample(ok=False)
    for event in iter_sse(resp.iter_lines(chunk_size=None)):
        if event.event == "chunk" and not sample.ttft:
            sample.ttft = time.perf_counter() - t0
        elif event.event == "done":
            done = event.json()
            sample.ok = done["status"] == "succeeded"
            sample.tokens = done["usage"]["completion_tokens"]
            sample.latency = time.perf_counter() - t0
            break
    return sample


def llmq_job(url: str, messages: list[dict], max_tokens: int, model: str | None = None) -> tuple[str | None, Sample]:
    """A greedy job through llmq's jobs API, result cache off, followed over its event stream:
    its id (None if refused) and what the client saw."""
    t0 = time.perf_counter()
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "cache": False}
    job = requests.post(f"{url}/v1/jobs", json={**body, **({"model": model} if model else {})}, timeout=60)
    if job.status_code != 202:
        return None, Sample(ok=False)
    with requests.get(f"{url}{job.json()['links']['events']}", stream=True, timeout=900) as resp:
        return job.json()["id"], read_job_events(resp, t0)


def llmq_request(url: str, prompt: str, max_tokens: int) -> Sample:
    return llmq_job(url, [{"role": "user", "content": prompt}], max_tokens)[1]


def baseline_request(url: str, prompt: str, max_tokens: int) -> Sample:
    """The baseline server's `/generate` (bench/harness/baseline_app.py)."""
    t0 = time.perf_counter()
    with requests.post(f"{url}/generate", json={"messages": [{"role": "user", "content": prompt}],
                                                "max_tokens": max_tokens, "temperature": 0},
                       stream=True, timeout=3600) as resp:
        return read_job_events(resp, t0)


_MODEL_IDS: dict[str, str] = {}


def served_model(url: str, timeout: float = 60) -> str:
    """The id of the server's first model (asked once per server, waiting for one to be listed)."""
    deadline = time.monotonic() + timeout
    while url not in _MODEL_IDS:
        data = requests.get(f"{url}/v1/models", timeout=30).json().get("data")
        if data:
            _MODEL_IDS[url] = data[0]["id"]
        elif time.monotonic() > deadline:
            raise TimeoutError(f"no model served at {url}")
        else:
            time.sleep(1)
    return _MODEL_IDS[url]


def openai_request(url: str, prompt: str, max_tokens: int, system: str | None = None) -> Sample:
    """A greedy streamed chat completion of the server's model, after a `system` message where
    given. Tokens are the usage the server reports in its last chunk, or one per content delta
    where it reports none."""
    messages = [{"role": "system", "content": system}] if system else []
    model = served_model(url)
    t0 = time.perf_counter()
    sample, deltas, usage = Sample(ok=False), 0, None
    with requests.post(f"{url}/v1/chat/completions", stream=True, timeout=3600, json={
            "model": model, "messages": [*messages, {"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as resp:
        for event in iter_sse(resp.iter_lines(chunk_size=None)):
            if event.data == "[DONE]":
                sample.ok, sample.latency = True, time.perf_counter() - t0
                break
            body = event.json()
            sample.answer_id = sample.answer_id or body.get("id", "")
            usage = body.get("usage") or usage
            choice = body["choices"][0] if body.get("choices") else {}
            delta = choice.get("delta", {}).get("content")
            if delta:
                deltas += 1
            # an answer with no text at all (now and then a random-weight model's) is timed at its end
            if delta or choice.get("finish_reason"):
                sample.ttft = sample.ttft or time.perf_counter() - t0
    sample.tokens = usage["completion_tokens"] if usage else deltas
    return sample


def responses_request(url: str, prompt: str, max_tokens: int) -> Sample:
    """A greedy streamed response (foreground): TTFT at the first text delta, tokens from the
    final usage."""
    model = served_model(url)
    t0 = time.perf_counter()
    sample = Sample(ok=False)
    with requests.post(f"{url}/v1/responses", stream=True, timeout=3600, json={
            "model": model, "input": prompt, "max_output_tokens": max_tokens,
            "temperature": 0, "stream": True}) as resp:
        for event in iter_sse(resp.iter_lines(chunk_size=None)):
            if event.event == "response.output_text.delta" and not sample.ttft:
                sample.ttft = time.perf_counter() - t0
            elif event.event in RESPONSE_ENDS:
                sample.ok = event.event != "response.failed"
                sample.tokens = event.json()["response"]["usage"]["output_tokens"]
                sample.latency = time.perf_counter() - t0
                break
    return sample
