"""Tool calls read back from a job's text (common/tool_parser.py) and the schemas that force them
(common/tools.py): pure functions, no Redis."""
import json

import jsonschema
import pytest

from common.schemas import JobRequest
from common.tool_parser import CallArguments, CallEnd, CallStart, TextPiece, ToolCallStream, read_calls
from common.tools import ToolCalling, ToolSpec, inline_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
AUTO = ToolCalling(mode="auto", names=["get_weather", "get_time"])


def feed_in_pieces(calling: ToolCalling, text: str, size: int) -> list:
    stream = ToolCallStream("job1", calling)
    events = [e for i in range(0, len(text), size) for e in stream.feed(text[i:i + size])]
    return events + stream.finish()


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_auto_reads_calls_and_text_however_the_text_is_cut(size):
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    events = feed_in_pieces(AUTO, text, size)
    assert "".join(e.text for e in events if isinstance(e, TextPiece)) == "Let me check."
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_time")]
    arguments = {i: "".join(e.delta for e in events if isinstance(e, CallArguments) and e.index == i) for i in (0, 1)}
    assert json.loads(arguments[0]) == {"city": "Paris"} and json.loads(arguments[1]) == {}
    assert [e.index for e in events if isinstance(e, CallEnd)] == [0, 1]


def test_call_ids_are_the_same_for_the_same_job_and_differ_between_jobs():
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    one, again = read_calls("jobA", AUTO, text)[1], read_calls("jobA", AUTO, text)[1]
    other = read_calls("jobB", AUTO, text)[1]
    assert one == again and one[0].call_id != other[0].call_id


@pytest.mark.parametrize("text", [
    "Paris is sunny < 30 degrees,\n a <tool that is not a call",
    '<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>',  # not an offered tool
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',  # cut off by the length limit
])
def test_text_that_is_not_a_call_is_shown_whole(text):
    content, calls = read_calls("job1", AUTO, text)
    assert calls == [] and content == text
    assert "".join(e.text for e in feed_in_pieces(AUTO, text, 2) if isinstance(e, TextPiece)) == text


def test_a_named_call_streams_its_arguments_as_they_come():
    calling = ToolCalling(mode="named", names=["get_weather"], forced="get_weather")
    events = feed_in_pieces(calling, '{"city": "Oslo"}', 4)
    assert isinstance(events[0], CallStart) and events[0].name == "get_weather"
    assert [e.delta for e in events if isinstance(e, CallArguments)] == ['{"ci', 'ty":', ' "Os', 'lo"}']
    assert isinstance(events[-1], CallEnd)
    assert read_calls("job1", calling, '{"city": "Oslo"}') == (None, [read_calls("job1", calling, '{"city": "Oslo"}')[1][0]])


def test_required_reads_the_array_of_calls():
    calling = ToolCalling(mode="required", names=["get_weather", "get_time"])
    text = '[{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]'
    content, calls = read_calls("job1", calling, text)
    assert content is None and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Rome"}), ("get_time", {})]


def test_the_forcing_schemas_accept_only_calls_of_the_offered_tools():
    tools = [ToolSpec.model_validate(WEATHER), ToolSpec.model_validate(TIME)]
    required = ToolCalling(mode="required", names=["get_weather", "get_time"]).output_schema(tools, parallel=False)
    jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Rome"}}], required)
    for bad in ([], [{"name": "launch", "parameters": {}}], [{"name": "get_weather", "parameters": {}}],
                [{"name": "get_time", "parameters": {}}] * 2):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, required)
    named = ToolCalling(mode="named", names=["get_weather"], forced="get_weather").output_schema(tools, True)
    assert named == WEATHER["function"]["parameters"]


@pytest.mark.parametrize("fields, message", [
    ({"tool_choice": "required"}, "no tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tools": [WEATHER, WEATHER]}, "same name"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot both"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": 5}}}]}, "not a valid JSON Schema"),
])
def test_requests_whose_tools_cannot_work_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        JobRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_tool_conversations_validate():
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    JobRequest.model_validate({"messages": messages, "tools": [WEATHER]})
    for bad in ({"role": "tool", "content": "sunny"}, {"role": "assistant", "content": None},
                {"role": "user", "content": "x", "tool_call_id": "c1"}):
        with pytest.raises(ValueError):
            JobRequest.model_validate({"messages": [bad]})


def test_a_template_without_tools_gets_them_in_hermes_form():
    messages = inline_tools([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"},
                             {"role": "assistant", "content": None, "tool_calls": [
                                 {"id": "c1", "type": "function",
                                  "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], [WEATHER])
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("Be brief.") and '"name": "get_weather"' in messages[0]["content"]
    assert json.loads(messages[2]["content"].removeprefix("<tool_call>").removesuffix("</tool_call>")) == {
        "name": "get_weather", "arguments": {"city": "Paris"}}
    assert messages[3]["content"] == "<tool_response>\nsunny\n</tool_response>"
