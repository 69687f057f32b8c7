"""logprobs, top_logprobs and n through the official `openai` client against a real worker on the
HF engine (the OpenVINO and vLLM modules check their engines' logprobs too), and logprobs on
/v1/jobs."""
import json

import openai
import pytest
import requests

from tests.support.jobs import read_stream, submit
from tests.support.logprobs import FRANCE, check_chat_logprobs
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(hf_stack):
    return openai.OpenAI(base_url=f"{hf_stack[1]}/v1", api_key="unused", max_retries=0, timeout=600)


def test_chat_logprobs_whole_and_streamed_are_the_same(client):
    entries = check_chat_logprobs(client, MODEL, top=3, extra_body={"cache": False})
    stream = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=16, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True, extra_body={"cache": False})
    streamed = [e for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]
    # the second run reuses the prompt's cached prefix: the same numbers up to float rounding
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-3)


def test_a_cached_answer_keeps_its_logprobs(client):
    first = check_chat_logprobs(client, MODEL, top=2, max_completion_tokens=16)
    again = check_chat_logprobs(client, MODEL, top=2, max_completion_tokens=16)  # from the result cache
    assert again == first
    plain = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=16, temperature=0)
    assert plain.choices[0].logprobs is None  # asked without logprobs: none, and not that cache entry


def test_completion_logprobs_in_the_legacy_shape(client):
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8,
                                      temperature=0, logprobs=2)
    choice = reply.choices[0]
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and top[token] == logprob == max(top.values()) and logprob <= 0


def test_n_sampled_choices_whole(client, hf_stack):
    reply = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=FRANCE, max_tokens=16, temperature=1.0, n=3)
    completion = reply.parse()
    job_ids = reply.headers["X-LLMQ-Job-Ids"].split(",")
    assert [c.index for c in completion.choices] == [0, 1, 2] and len(set(job_ids)) == 3
    texts = [c.message.content for c in completion.choices]
    assert all(texts) and len(set(texts)) > 1, texts  # each choice sampled its own answer
    jobs = [wait_for_job(hf_stack[1], job_id) for job_id in job_ids]
    assert not any(job["coalesced"] for job in jobs)
    assert completion.usage.completion_tokens == sum(job["usage"]["completion_tokens"] for job in jobs)
    assert completion.usage.prompt_tokens == jobs[0]["usage"]["prompt_tokens"]


def test_n_sampled_choices_streamed_with_logprobs_and_usage(client):
    stream = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                       n=3, logprobs=1, stream=True, stream_options={"include_usage": True})
    texts, tokens, finished, usage = {}, {}, set(), None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.logprobs is not None:
                tokens.setdefault(choice.index, []).extend(choice.logprobs.tokens)
            if choice.finish_reason is not None:
                finished.add(choice.index)
    assert finished == {0, 1, 2} and set(texts) == {0, 1, 2}
    assert all("".join(tokens[i]) == texts[i] for i in range(3))
    assert len(set(texts.values())) > 1, texts
    assert usage is not None and usage.completion_tokens == sum(len(tokens[i]) for i in range(3))


def test_seeded_choices_are_each_reproducible(client):
    def ask():
        reply = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=1.0,
                                               seed=11, n=2, extra_body={"cache": False})
        return [c.message.content for c in reply.choices]
    first = ask()
    assert ask() == first and first[0] != first[1]  # sibling i samples with seed + i


def test_leaving_an_n_stream_cancels_every_choice(client, hf_stack):
    url = hf_stack[1]
    with requests.post(f"{url}/v1/chat/completions", stream=True, timeout=60, json={
            "model": MODEL, "messages": FRANCE, "max_tokens": 400, "temperature": 1.0, "n": 2,
            "stream": True}) as resp:
        job_ids = resp.headers["X-LLMQ-Job-Ids"].split(",")
        next(resp.iter_lines())
    for job_id in job_ids:
        wait_until(lambda: requests.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()["status"] == "cancelled",
                   60, message=f"job {job_id} was not cancelled")


def test_jobs_api_logprobs_in_chunks_and_record(hf_stack):
    url = hf_stack[1]
    job = submit(url, prompt="1, 2, 3,", max_tokens=6, temperature=0, logprobs=True, top_logprobs=1, cache=False)
    final = wait_for_job(url, job["id"])
    assert final["status"] == "succeeded" and len(final["logprobs"]) == final["usage"]["completion_tokens"] == 6
    events = read_stream(url, job["id"])
    chunks = [json.loads(e.data) for e in events if e.event == "chunk"]
    assert [e for c in chunks for e in c["logprobs"]] == final["logprobs"]
    assert "".join(e["token"] for e in final["logprobs"]) == final["text"]
    assert all(len(e["top_logprobs"]) == 1 for e in final["logprobs"])
    assert json.dumps(final["logprobs"])  # plain JSON: no NaN or infinity


def test_a_responses_output_text_carries_its_logprobs(client, model_ref):
    """The Responses API: `top_logprobs` (or include message.output_text.logprobs) gives the output
    text's logprobs, whole and streamed, the same ones."""
    request = dict(model=model_ref.name, input="Name a colour.", max_output_tokens=8, temperature=0, top_logprobs=2,
                   include=["message.output_text.logprobs"], extra_body={"cache": False})
    whole = client.responses.create(**request)
    entries = whole.output[0].content[0].logprobs
    assert entries and all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in entries)
    assert "".join(e.token for e in entries) == whole.output_text
    streamed = [e for e in client.responses.create(**request, stream=True) if e.type == "response.output_text.delta"]
    assert [t.token for e in streamed for t in e.logprobs] == [e.token for e in entries]
