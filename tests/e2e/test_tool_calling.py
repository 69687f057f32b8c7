"""Tool calling on chat completions, with the official clients (the openai SDK, LangChain's
ChatOpenAI, the OpenAI Agents SDK) against a live llmq and the embedded model. A forced call
(required, or a named function) is enforced by the engine's structured output, so even this tiny
model makes a call whose arguments are valid for its schema."""
import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(live_api):
    return openai.OpenAI(base_url=f"{live_api}/v1", api_key="unused", max_retries=0, timeout=300)


def test_a_named_tool_choice_gets_a_call_with_valid_arguments(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=NAMED,
                                           max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), CITY)


def test_required_gets_calls_of_offered_tools_only(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=60, temperature=0)
    calls = reply.choices[0].message.tool_calls
    assert calls and reply.choices[0].finish_reason == "tool_calls"
    for call in calls:
        schema = {"get_weather": CITY, "get_time": TIME["function"]["parameters"]}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    assert len({c.id for c in calls}) == len(calls)


def test_a_streamed_call_assembles_to_the_same_call(client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                           max_tokens=40, temperature=0).choices[0].message.tool_calls[0]
    stream = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                            max_tokens=40, temperature=0, stream=True,
                                            extra_body={"cache": False})  # generated, not the cached answer
    pieces, names, ids, finish = [], [], [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for call in delta.tool_calls or []:
            assert call.index == 0
            names += [call.function.name] if call.function.name else []
            ids += [call.id] if call.id else []
            pieces.append(call.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"] and len(ids) == 1 and finish == "tool_calls"
    assert len([p for p in pieces if p]) > 1  # the arguments arrive as they are generated (the first token at once)
    assert json.loads("".join(pieces)) == json.loads(whole.function.arguments)


def test_a_replayed_tool_conversation_is_answered(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees."}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none",
                                           max_tokens=24, temperature=0)
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None
    auto = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=24,
                                          temperature=0)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_requests_that_cannot_work_are_400s_naming_why(client):
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[TIME], tool_choice=NAMED)
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        client.chat.completions.create(model=MODEL, messages=[*ASK, {"role": "tool", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="functions"):
        client.chat.completions.create(model=MODEL, messages=ASK, functions=[WEATHER["function"]])


def test_langchain_bind_tools_returns_tool_calls(live_api):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=MODEL, base_url=f"{live_api}/v1", api_key="unused", temperature=0, max_tokens=40,
                     max_retries=0)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)


def test_an_agents_sdk_runner_calls_its_tool_through_responses(live_api):
    from agents import (Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers otherwise
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"It is sunny in {city}."

    model = OpenAIResponsesModel(model=MODEL, openai_client=openai.AsyncOpenAI(
        base_url=f"{live_api}/v1", api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=model,
                  model_settings=ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=40),
                  tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True))
    assert len(seen) == 1 and result.final_output == f"It is sunny in {seen[0]}."
