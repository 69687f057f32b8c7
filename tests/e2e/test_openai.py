"""The OpenAI-compatible API, driven by the official `openai` package against a live llmq
(Flask API on a socket -> Redis/Celery -> a real worker with the embedded model)."""
import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from api import create_app
from tests.support.servers import LiveServer
from tests.support.waiting import wait_for_job

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2},
        "retired": {"type": "boolean"},
    },
    "required": ["name", "age", "colour", "hobbies", "retired"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def client(live_api):
    return openai.OpenAI(base_url=f"{live_api}/v1", api_key="unused", max_retries=0, timeout=900)


def job_of(completion_id: str) -> str:
    return completion_id.split("-", 1)[1]


# --- models, chat, completions ------------------------------------------------------------------

def test_models_lists_what_live_workers_serve(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_chat_completion(client, live_api):
    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=24, temperature=0)
    assert reply.object == "chat.completion" and reply.model == MODEL
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= 24
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    job = wait_for_job(live_api, job_of(reply.id))  # the same job, visible on the jobs API
    assert job["text"] == choice.message.content


def test_completion_with_stop_and_max_tokens(client):
    prompt = "One, two, three, four, five,"
    capped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    assert capped.object == "text_completion"
    assert capped.choices[0].finish_reason == "length" and capped.usage.completion_tokens == 5
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=60, temperature=0,
                                        stop=["eight"])
    text = stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop" and "seven" in text and "eight" not in text


def test_max_completion_tokens_and_seed(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Invent a name for a cat."}],
                  max_completion_tokens=12, temperature=1.0, seed=7, extra_body={"cache": False})
    a, b = client.chat.completions.create(**kwargs), client.chat.completions.create(**kwargs)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens <= 12


def test_frequency_penalty_changes_a_repetitive_answer(client):
    kwargs = dict(model=MODEL, prompt="red, red, red, red, red, red,", max_tokens=12, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text
    penalised = client.completions.create(frequency_penalty=2.0, presence_penalty=1.0, **kwargs)
    assert penalised.choices[0].text != plain
    assert plain.count("red") > penalised.choices[0].text.count("red")


# --- streaming --------------------------------------------------------------------------------

def test_streamed_chat_matches_the_whole_answer_and_reports_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=FRANCE, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"cache": False}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    # really streamed: the first token alone at once, the rest in later chunks (one per stream interval)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_streamed_completion_wire_format(live_api):
    body = {"model": MODEL, "prompt": "A list of European rivers:", "max_tokens": 16, "stream": True,
            "temperature": 0}
    with requests.post(f"{live_api}/v1/completions", json=body, stream=True, timeout=300) as resp:
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in chunks).strip()


# --- structured output ------------------------------------------------------------------------

def test_json_object_mode(client):
    # a prompt the 135M model answers with a short object in every engine's precision (asked for
    # "capital and population", it lists numbers in a loop at int8 until max_tokens, grammar or not)
    reply = client.chat.completions.create(
        model=MODEL, max_tokens=300, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Give the name and capital of France as JSON."}])
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_json_schema_with_the_clients_pydantic_parse(client):
    class City(BaseModel):
        name: str = Field(max_length=30)
        country: str = Field(max_length=30)
        population: int = Field(ge=0, le=100_000_000)

    reply = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about Paris."}], response_format=City,
        max_tokens=200, temperature=0)
    city = reply.choices[0].message.parsed
    assert isinstance(city, City) and city.name


@pytest.mark.timeout(1200)  # 20 generations at once; the test machine may be busy
def test_twenty_json_schema_requests_all_validate(client):
    def ask(seed):
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Describe a person."}],
            response_format=PERSON_FORMAT, max_tokens=200, temperature=0.9, seed=seed)

    with ThreadPoolExecutor(20) as pool:
        replies = list(pool.map(ask, range(20)))
    people = []
    for reply in replies:
        assert reply.choices[0].finish_reason == "stop"
        person = json.loads(reply.choices[0].message.content)
        jsonschema.validate(person, PERSON)
        people.append(person)
    assert len({json.dumps(p) for p in people}) > 1  # sampled, not one answer repeated


def test_response_format_on_the_jobs_api(live_api):
    body = {"messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 200,
            "temperature": 0, "response_format": PERSON_FORMAT}
    job = requests.post(f"{live_api}/v1/jobs", json=body, timeout=30).json()
    done = wait_for_job(live_api, job["id"], timeout=600)
    assert done["status"] == "succeeded"
    jsonschema.validate(json.loads(done["text"]), PERSON)


# --- errors -------------------------------------------------------------------------------------

def assert_openai_error(exc_info, status, param=None):
    err = exc_info.value
    assert err.status_code == status
    body = err.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and body["error"]["type"]
    if param:
        assert body["error"]["param"].startswith(param)
    return body["error"]


@pytest.mark.parametrize("kwargs, param", [
    ({"n": 9}, "n"),
    ({"temperature": 5}, "temperature"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"max_tokens": 100_000}, None),
    ({"extra_body": {"colour": "blue"}}, "colour"),
])
def test_bad_parameters_are_400_in_openai_shape(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as exc_info:
        client.chat.completions.create(model=MODEL, messages=FRANCE, **kwargs)
    error = assert_openai_error(exc_info, 400, param)
    assert error["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_bad_json_is_400(client, live_api):
    with pytest.raises(openai.NotFoundError) as exc_info:
        client.chat.completions.create(model="gpt-9", messages=FRANCE)
    assert assert_openai_error(exc_info, 404, "model")["code"] == "model_not_found"
    resp = requests.post(f"{live_api}/v1/chat/completions", data=b"{oops",
                         headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    # a streaming request refused before it starts is a plain JSON error too
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x " * 5000, stream=True)
    # the jobs API keeps its own error shape
    assert set(requests.post(f"{live_api}/v1/jobs", json={}, timeout=10).json()["error"]) == \
        {"type", "message", "details"}


# --- client disconnects ---------------------------------------------------------------------------

def stream_then_leave(client, max_tokens):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a very long essay about the ocean."}],
        max_tokens=max_tokens, temperature=0.8, seed=1, stream=True)
    seen = [next(stream) for _ in range(4)]
    stream.close()
    return job_of(seen[0].id)


def test_leaving_a_stream_cancels_its_job(client, live_api):
    job_id = stream_then_leave(client, max_tokens=400)
    job = wait_for_job(live_api, job_id, timeout=120)
    assert job["status"] == "cancelled" and job["finish_reason"] == "cancelled"
    assert 0 < job["usage"]["completion_tokens"] < 400


def test_leaving_a_stream_keeps_the_job_when_so_configured(stack_settings, worker):
    server = LiveServer(create_app(stack_settings.model_copy(update={"cancel_on_disconnect": False})))
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
        job_id = stream_then_leave(client, max_tokens=80)
        job = wait_for_job(server.url, job_id, timeout=600)
        assert job["status"] == "succeeded" and job["usage"]["completion_tokens"] > 4
    finally:
        server.stop()
