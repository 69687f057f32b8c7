"""OpenAI chat and completion streams across a job that had to start over after its worker was
lost (a `restart` in its log), without a worker (real Redis): the stream goes on unseen when
nothing of the answer was shown yet or when the new attempt says again what was shown, and ends
with a `worker_lost` error chunk only when the new attempt says something else."""
import json
import threading

import pytest
import requests

from tests.support.jobs import end_as_a_worker, log_as_a_worker
from tests.support.waiting import wait_until

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def streamed(api, route, pieces, final_text, **body):
    """The chunks of a streamed request whose job's log holds `pieces` (strings are chunks, None
    a restart), then ends with `final_text`, as if a worker had run it. The stream is read as it
    goes: what comes before the first restart has reached the client when the restart is logged
    (a reader that first looks after the restart never sees the abandoned chunks)."""
    reply = requests.post(api.serve() + route, stream=True, timeout=30,
                          json={"model": MODEL, "stream": True, "cache": False, **body})
    assert reply.status_code == 200, reply.text
    svc = api.services
    job_ids = reply.headers.get("X-LLMQ-Job-Ids", reply.headers["X-LLMQ-Job-Id"]).split(",")
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.extend(reply.iter_content(chunk_size=None)), daemon=True)
    reader.start()
    cut = pieces.index(None) if None in pieces else len(pieces)
    for job_id in job_ids:
        log_as_a_worker(svc, job_id, pieces[:cut])
    shown = json.dumps("".join(pieces[:cut]))[1:-1]
    if shown and "tools" not in body:  # a forced call shows nothing until its arguments
        wait_until(lambda: shown in text_of(received), message="the chunks before the restart were not relayed")
    for job_id in job_ids:
        log_as_a_worker(svc, job_id, pieces[cut:])
        end_as_a_worker(svc, job_id, final_text)
    reader.join(30)
    assert not reader.is_alive(), "the stream did not end"
    lines = text_of(received).splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def text_of(received: list[bytes]) -> str:
    return "".join(part.decode() if isinstance(part, bytes) else part for part in list(received))


def chat(api, pieces, final_text, **body):
    return streamed(api, "/v1/chat/completions", pieces, final_text,
                    messages=[{"role": "user", "content": "Hello"}], **body)


def content(chunks):
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


@pytest.mark.parametrize("pieces", [
    ["Hello wor", None, "Hello world!"],  # the new attempt says again what was sent, then more
    ["Hello wor", None, "Hel", "lo w", "orld!"],  # in other pieces
    [None, "Hello world!"],  # nothing was sent before the restart
])
def test_a_chat_stream_goes_on_seamlessly_across_a_restart(api, pieces):
    chunks = chat(api, pieces, "Hello world!")
    assert content(chunks) == "Hello world!"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("error" in c for c in chunks)


def test_a_chat_stream_whose_new_attempt_says_otherwise_ends_with_worker_lost(api):
    chunks = chat(api, ["Hello wor", None, "Hi there"], "Hi there")
    assert content(chunks) == "Hello wor"
    assert chunks[-1]["error"]["code"] == "worker_lost"


def test_a_restarted_forced_call_streams_only_its_new_attempts_call(api):
    """Nothing of a forced call is shown before its arguments begin: a restart there is unseen."""
    chunks = chat(api, ['[{"name": "get_weather", ', None, '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'],
                  '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]', tools=[WEATHER], tool_choice="required")
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert [c["function"]["name"] for c in calls if c["function"].get("name")] == ["get_weather"]
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"city": "Oslo"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_completion_stream_goes_on_seamlessly_across_a_restart(api):
    chunks = streamed(api, "/v1/completions", ["Once upon", None, "Once upon a time"], "Once upon a time",
                      prompt="Tell a story")
    assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) == "Once upon a time"
    assert not any("error" in c for c in chunks)


def test_each_choice_of_several_goes_on_across_a_restart_or_ends_with_worker_lost(api):
    same = streamed(api, "/v1/chat/completions", ["Hello wor", None, "Hello world!"], "Hello world!", n=2,
                    messages=[{"role": "user", "content": "Hello"}], temperature=0.7)
    for index in (0, 1):
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in same
                       if c.get("choices") and c["choices"][0]["index"] == index)
        assert text == "Hello world!"
    other = streamed(api, "/v1/chat/completions", ["Hello wor", None, "Hi there"], "Hi there", n=2,
                     messages=[{"role": "user", "content": "Hello"}], temperature=0.7)
    assert other[-1]["error"]["code"] == "worker_lost"
