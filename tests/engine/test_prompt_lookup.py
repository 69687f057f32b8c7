"""Prompt-lookup (n-gram) speculative decoding on the engines that offer it, OpenVINO GenAI and
vLLM's CPU build: the answers are the ones the engine gives without it (greedy, token for token;
stop strings and JSON output alike), and drafting does happen (fewer steps than tokens).

Each engine is built twice, without and then with `prompt_lookup`, one at a time, on the embedded
model; the same requests run on both and the tests compare what came back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from common.schemas import FinishReason
from tests.support.settings import make_settings
from worker.engine.sequence import EngineRequest, ResponseFormat, Sampling

pytestmark = pytest.mark.slow

PARAGRAPH = ("The river town of Elmsford sits where two valleys meet. Every spring the snowmelt swells the "
             "water, and the old stone bridge, built in 1782 by a mason named Thomas Hale, disappears for a "
             "week under the flood. Children wait on the hill for the first arch to show again, and the "
             "baker gives a free loaf to whoever sees it first.")
SCHEMA = json.dumps({"type": "object", "properties": {"town": {"type": "string"}, "mason": {"type": "string"},
                                                      "year": {"type": "integer"}},
                     "required": ["town", "mason", "year"], "additionalProperties": False})
REQUESTS = {  # name -> (user message, sampling)
    "copy": (f"Repeat this text exactly: {PARAGRAPH}", Sampling(max_tokens=96, temperature=0)),
    "stop": (f"Repeat this text exactly: {PARAGRAPH}", Sampling(max_tokens=96, temperature=0, stop=("bridge",))),
    "json": (f"Read this text: {PARAGRAPH}\nAnswer in JSON: the town, the mason and the year.",
             Sampling(max_tokens=96, temperature=0, response_format=ResponseFormat("json_schema", SCHEMA))),
    "sampled": (f"Summarise this text: {PARAGRAPH}",
                Sampling(max_tokens=48, temperature=0.8, seed=7, presence_penalty=0.5)),
}
ENGINE_MODULES = {"openvino": "openvino_genai", "vllm": "vllm"}


@dataclass
class Answer:
    chunks: list[str] = field(default_factory=list)  # the text of each step that made some
    token_ids: list[int] = field(default_factory=list)
    steps: int = 0  # engine steps that gave it new tokens
    finish_reason: FinishReason | None = None

    @property
    def text(self) -> str:
        return "".join(self.chunks)


def answers(kind: str, model_ref, prompt_ids: dict, lookup: bool) -> dict:
    """Every request's text, final output and step count on a fresh engine, run one at a time."""
    from worker.engine.registry import build_engine

    # float weights (OpenVINO's bf16 export, computed in f32): the tests need answers that copy
    # the paragraph, which the 135M model gives as trained; int8's rounding can make it paraphrase
    settings = make_settings(engine=kind, dtype="float32", weights="bf16", kv_cache_mb=256, max_model_len=1024,
                             max_batch_size=4, vllm_enforce_eager=True, prompt_lookup=lookup,
                             prompt_lookup_tokens=4, prompt_lookup_ngram=3)
    engine, info = build_engine(settings, model_ref)
    assert info["engine"] == kind
    out = {"info": info}
    try:
        for name, (_, sampling) in REQUESTS.items():
            engine.add_request(EngineRequest(name, prompt_ids[name], sampling))
            out[name] = run_alone(engine)
    finally:
        engine.close()
    return out


def run_alone(engine) -> Answer:
    """Step the engine's one request to its end: its text as streamed, its ids, the steps it took."""
    answer, steps_before = Answer(), engine.stats.steps
    while engine.has_unfinished():
        for output in engine.step():
            answer.chunks.append(output.text)
            answer.token_ids += output.new_token_ids
            answer.finish_reason = output.finish_reason if output.finished else None
    answer.steps = engine.stats.steps - steps_before  # the engine's steps, not the bunches relayed
    return answer


@pytest.fixture(scope="module", params=list(ENGINE_MODULES))
def runs(request, model_ref):
    pytest.importorskip(ENGINE_MODULES[request.param], reason=f"the {request.param} engine is not installed")
    from common.prompting import PromptBuilder

    builder = PromptBuilder(model_ref.path, 1024)
    prompt_ids = {name: builder.build([{"role": "user", "content": text}], None)[1]
                  for name, (text, _) in REQUESTS.items()}
    return {lookup: answers(request.param, model_ref, prompt_ids, lookup) for lookup in (False, True)}


def test_the_engine_reports_prompt_lookup(runs):
    assert runs[False]["info"]["prompt_lookup"] is False
    assert runs[True]["info"]["prompt_lookup"] == {"tokens": 4, "ngram": 3}


def test_greedy_answers_are_the_same_token_for_token_in_fewer_steps(runs):
    off, on = runs[False]["copy"], runs[True]["copy"]
    assert on.token_ids == off.token_ids and on.text == off.text
    assert len(off.token_ids) > 40 and "Thomas Hale" in on.text  # the model did copy its input
    # drafts from the prompt were accepted: several tokens in some steps
    assert on.steps < off.steps * 0.75, (on.steps, off.steps)


def test_a_stop_string_inside_an_accepted_draft_still_ends_the_text_there(runs):
    off, on = runs[False]["stop"], runs[True]["stop"]
    assert on.text == off.text and "bridge" not in on.text
    assert on.finish_reason == off.finish_reason == FinishReason.STOP


def test_structured_output_is_the_same_valid_json(runs):
    off, on = runs[False]["json"], runs[True]["json"]
    assert on.text == off.text
    assert set(json.loads(on.text)) == {"town", "mason", "year"}, on.text


def test_sampled_and_penalised_requests_run_with_prompt_lookup(runs):
    on = runs[True]["sampled"]
    assert on.text and on.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
