"""Tool-calling checks every engine's end-to-end module runs through the `openai` client: a named
call, `required`, a streamed call, a replayed tool conversation. A forced call is enforced by the
engine's structured output, so even the tiny embedded model makes valid calls."""
from __future__ import annotations

import json

import jsonschema
import openai

CITY = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def check_named_call(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice=NAMED,
                                           max_tokens=40, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), CITY)


def check_required_calls(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                           max_tokens=60, temperature=0)
    calls = reply.choices[0].message.tool_calls
    assert calls and reply.choices[0].finish_reason == "tool_calls"
    for call in calls:
        schema = {"get_weather": CITY, "get_time": TIME["function"]["parameters"]}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    assert len({c.id for c in calls}) == len(calls)


def check_streamed_call(client: openai.OpenAI, model: str) -> None:
    whole = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
                                           max_tokens=40, temperature=0).choices[0].message.tool_calls[0]
    stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice=NAMED,
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


def check_replayed_conversation(client: openai.OpenAI, model: str) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees."}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], tool_choice="none",
                                           max_tokens=24, temperature=0)
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None
    auto = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=24,
                                          temperature=0)
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


ALL_CHECKS = (check_named_call, check_required_calls, check_streamed_call, check_replayed_conversation)
