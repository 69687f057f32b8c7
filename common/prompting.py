"""Chat templating and token counting without torch, so the API can validate prompts.

Uses the model folder's `tokenizer.json` (Rust `tokenizers`) and its Jinja chat template, rendered
the way transformers renders it (sandboxed, trim_blocks/lstrip_blocks).
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from common.offload import encode_batch
from common.prompt_pieces import PieceEncoder
from common.tools import inline_tools, template_messages


class TemplateError(ValueError):
    """The chat template rejected the messages (e.g. roles out of order)."""


def _raise_exception(message: str):
    raise TemplateError(message)


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


class PromptBuilder:
    """Turns a request's messages or raw prompt into the exact token ids the worker will run."""

    def __init__(self, model_dir: Path, max_model_len: int):
        model_dir = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._pieces = PieceEncoder.for_tokenizer(self.tokenizer)  # a chat's repeated parts, encoded once
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        template_file = model_dir / "chat_template.jinja"
        template = template_file.read_text() if template_file.exists() else config.get("chat_template")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        model_config = json.loads((model_dir / "config.json").read_text())
        self.context_length = min(max_model_len, model_config.get("max_position_embeddings", max_model_len))
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(template) if template else None
        # a template that renders tools itself (Qwen2.5's) also renders calls and their results
        self.renders_tools = bool(template) and "tools" in template

    def render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The prompt text; `tools` (OpenAI's function specs) as the template shows them, or in
        the system message for a template that knows nothing of tools (common/tools.py)."""
        if self._template is None:
            raise TemplateError("this model has no chat template; send a raw 'prompt'")
        if self.renders_tools:
            messages, extra = template_messages(messages), ({"tools": tools} if tools else {})
        else:
            uses_tools = tools or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
            messages, extra = (inline_tools(messages, tools) if uses_tools else messages), {}
        try:
            return self._template.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as exc:
            raise TemplateError(str(exc)) from exc

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._pieces is not None and not add_special_tokens:
            return self._pieces.encode(text)
        return encode_batch(self.tokenizer, [text], add_special_tokens)[0].ids

    def build(self, messages: list[dict] | None, prompt: str | None,
              tools: list[dict] | None = None) -> tuple[str, list[int]]:
        """(prompt text, token ids). Chat templates carry their own special tokens. A raw prompt
        is sent as it is: it shows any tools the way its writer chose."""
        if messages is not None:
            text = self.render(messages, tools)
            return text, self.encode(text, add_special_tokens=False)
        return prompt, self.encode(prompt, add_special_tokens=True)
