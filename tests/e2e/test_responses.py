"""OpenAI's Responses API over llmq's jobs, driven by the official `openai` package against a live
llmq: background responses polled, streamed, resumed on another API process by sequence number,
cancelled; chains by previous_response_id; tool calls; an API process restarted in between."""
import json

import jsonschema
import openai
import pytest
import requests

from tests.support.api_process import ApiProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": CITY}
LONG = "Write a long story about a lighthouse keeper and the sea."


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(live_api):
    return client_of(live_api)


@pytest.fixture(scope="module")
def other_api(stack_settings, worker, tmp_path_factory):
    """A second API process on the same Redis: any process serves any response."""
    process = ApiProcess(stack_settings, tmp_path_factory.mktemp("api") / "api.log")
    yield process
    process.stop()


def poll(client, response_id: str):
    result = {}
    wait_until(lambda: result.setdefault("r", client.responses.retrieve(response_id)).status
               not in ("queued", "in_progress") or result.pop("r") is None, timeout=120, interval=0.2)
    return result["r"]


def test_background_create_then_poll_to_completed(client):
    created = client.responses.create(model=MODEL, input="What is the capital of France?", background=True,
                                      max_output_tokens=24, temperature=0, extra_body={"cache": False})
    assert created.id.startswith("resp_") and created.status in ("queued", "in_progress")
    done = poll(client, created.id)
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.usage.output_tokens > 0 and done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert done.background is True and done.output[0].type == "message"


def test_a_dropped_stream_resumes_on_another_api_process(client, other_api):
    stream = client.responses.create(model=MODEL, input=LONG, background=True, stream=True, max_output_tokens=96,
                                     temperature=0, extra_body={"cache": False})
    seen, deltas, response_id = [], [], None
    for event in stream:
        seen.append(event.sequence_number)
        response_id = response_id or event.response.id
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
            if len(deltas) == 3:
                break
    stream.close()  # the client leaves; a background response goes on
    last = seen[-1]
    assert seen == list(range(len(seen)))
    resumed = client_of(other_api.url).responses.retrieve(response_id, stream=True, starting_after=last)
    types = []
    for event in resumed:
        assert event.sequence_number == last + 1
        last = event.sequence_number
        types.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        final = getattr(event, "response", None)
    assert types[-1] in ("response.completed", "response.incomplete")
    assert "".join(deltas) == final.output_text == client.responses.retrieve(response_id).output_text


def test_cancel_a_long_background_response(client):
    created = client.responses.create(model=MODEL, input=LONG, background=True, max_output_tokens=400,
                                      extra_body={"cache": False})
    wait_until(lambda: client.responses.retrieve(created.id).status == "in_progress", timeout=60, interval=0.1)
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(created.id).status == "cancelled"
    with pytest.raises(openai.APIStatusError) as caught:  # a finished response cannot be cancelled
        done = client.responses.create(model=MODEL, input="Hi", background=True, max_output_tokens=4)
        poll(client, done.id)
        client.responses.cancel(done.id)
    assert caught.value.status_code == 409


def test_a_chain_by_previous_response_id_sees_the_whole_conversation(client):
    first = client.responses.create(model=MODEL, input="My name is Ada. Say hello.", instructions="Be brief.",
                                    max_output_tokens=16, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0)
    assert second.previous_response_id == first.id
    # the second prompt holds the first's input and output (its instructions are not carried over)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 20
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "What is my name?"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_nope")


def test_tool_calls_come_back_as_function_call_items_and_their_outputs_go_on(client):
    called = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
                                     tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40,
                                     temperature=0)
    [call] = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), CITY)
    answer = client.responses.create(model=MODEL, previous_response_id=called.id, tools=[WEATHER],
                                     tool_choice="none", max_output_tokens=24, temperature=0,
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "Sunny, 24 degrees."}])
    assert answer.status in ("completed", "incomplete") and answer.output_text


def test_a_streamed_tool_call_assembles_from_its_deltas(client):
    events = list(client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER], stream=True,
                                          tool_choice="required", max_output_tokens=60, temperature=0,
                                          extra_body={"cache": False}))
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(deltas) == json.loads(done.arguments) and done.name == "get_weather"
    assert events[-1].type == "response.completed" and events[-1].response.output[-1].arguments == done.arguments


def test_an_api_restart_between_create_and_retrieve_loses_nothing(stack_settings, worker, tmp_path):
    first = ApiProcess(stack_settings, tmp_path / "first.log")
    created = client_of(first.url).responses.create(model=MODEL, input="Name three colours.", background=True,
                                                    max_output_tokens=24, extra_body={"cache": False})
    first.stop()
    second = ApiProcess(stack_settings, tmp_path / "second.log")
    try:
        done = poll(client_of(second.url), created.id)
        assert done.status in ("completed", "incomplete") and done.output_text
    finally:
        second.stop()


def test_delete_and_the_errors_of_the_surface(client, live_api):
    done = client.responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    client.responses.delete(done.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(done.id)
    for body, param in (({"model": MODEL, "input": "x", "conversation": "c1"}, "conversation"),
                        ({"model": MODEL, "input": "x", "frobnicate": 1}, None),
                        ({"model": MODEL, "input": [{"type": "image", "url": "x"}]}, "input"),
                        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, "tools"),
                        ({"model": MODEL, "input": "x", "background": True, "store": False}, "store")):
        reply = requests.post(f"{live_api}/v1/responses", json=body, timeout=30)
        assert reply.status_code == 400, body
        error = reply.json()["error"]
        assert (param is None and "frobnicate" in error["message"]) or error["param"].startswith(param)
    assert requests.post(f"{live_api}/v1/responses", json={"model": "gpt-9", "input": "x"}, timeout=30).status_code == 404


def test_text_format_json_schema_is_enforced(client):
    done = client.responses.create(model=MODEL, input="Weather in Oslo, as JSON.", max_output_tokens=40,
                                   text={"format": {"type": "json_schema", "name": "city", "schema": CITY}})
    assert done.status == "completed" and done.text.format.type == "json_schema"
    jsonschema.validate(json.loads(done.output_text), CITY)
