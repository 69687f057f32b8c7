"""Tool (function) calling: the tools a request offers, how the prompt shows them, and how the
model is held to a call when the request forces one.

Every engine gets the same job: a prompt and, when a call is forced, a JSON schema for its output
(the structured-output machinery each engine already has). The engines know nothing of tools; the
API turns the text back into calls (`common/tool_parser.py`), so any API process reads a job's
calls the same way from its record or its log.

- `auto`: the model's chat template renders the tools (Qwen2.5's Hermes format for Qwen models);
  a template without tool support gets them in its system message in the same format. The model
  answers with text, `<tool_call>{"name": ..., "arguments": ...}</tool_call>` blocks, or both.
- `required`: the output is constrained to a JSON array of `{"name", "parameters"}` objects, one
  per call, each `parameters` valid for its function's schema (as vLLM does).
- a named function: the output is constrained to that function's arguments.
- `none`: the tools are left out of the prompt and no call is parsed.
"""
from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator

NO_PARAMETERS: dict = {"type": "object", "properties": {}}
_SYSTEM_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_SYSTEM_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and "
                "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _a_schema(cls, value: dict | None) -> dict | None:
        if value is not None:
            try:
                jsonschema.validators.validator_for(value).check_schema(value)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"parameters is not a valid JSON Schema: {exc.message}")
        return value


class ToolSpec(BaseModel):
    """A tool as chat completions take it: `{"type": "function", "function": {...}}`."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionSpec


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: dict  # {"name": ...}

    @field_validator("function")
    @classmethod
    def _named(cls, value: dict) -> dict:
        if not isinstance(value.get("name"), str) or set(value) != {"name"}:
            raise ValueError("tool_choice.function must be {'name': <a tool's name>}")
        return value


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCalling(BaseModel):
    """What a job's record keeps to read calls back from its text: the mode, the function it
    forces (named), and the names it may call."""

    mode: Literal["auto", "required", "named"]
    names: list[str]
    forced: str | None = None

    @classmethod
    def plan(cls, tools: list[ToolSpec] | None, choice: ToolChoice | None) -> "ToolCalling | None":
        """None when no call can be made (no tools, or `tool_choice: none`); ValueError for a
        choice that names no offered tool, or that forces a call without tools."""
        if not tools:
            if choice not in (None, "none", "auto"):
                raise ValueError("tool_choice forces a call, but no tools were given")
            return None
        names = [t.function.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError("tools: two functions have the same name")
        if choice == "none":
            return None
        if isinstance(choice, NamedToolChoice):
            if choice.function["name"] not in names:
                raise ValueError(f"tool_choice names {choice.function['name']!r}, which is not among the tools")
            return cls(mode="named", names=names, forced=choice.function["name"])
        return cls(mode="required" if choice == "required" else "auto", names=names)

    def output_schema(self, tools: list[ToolSpec], parallel: bool) -> dict | None:
        """The JSON schema the output is held to (None for `auto`)."""
        params = {t.function.name: t.function.parameters or NO_PARAMETERS for t in tools}
        if self.mode == "named":
            return params[self.forced]
        if self.mode == "required":
            calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
                      "properties": {"name": {"const": name}, "parameters": schema}}
                     for name, schema in params.items()]
            return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
                    "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        return None


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as chat templates expect them: a call's arguments as an object (templates write
    them with `tojson`; OpenAI sends them as a JSON string)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"], "arguments": _as_object(call["function"]["arguments"])}}
                for call in calls]}
        out.append(message)
    return out


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def inline_tools(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """For a chat template that knows nothing of tools: the tools in the system message, calls
    and their results as text, all in the Hermes format that `auto` parses back."""
    out: list[dict] = []
    for message in template_messages(messages):
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            content, role = f"<tool_response>\n{content}\n</tool_response>", "user"
        for call in message.get("tool_calls") or []:
            body = json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]})
            content += f"\n<tool_call>\n{body}\n</tool_call>"
        if out and role == "user" and out[-1]["role"] == "user" and message["role"] == "tool":
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + content}  # results of one turn
        else:
            out.append({"role": role, "content": content.strip()})
    if tools:
        system = _SYSTEM_HEAD + "".join("\n" + json.dumps(t) for t in tools) + _SYSTEM_TAIL
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out
