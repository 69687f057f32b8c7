"""Constrained JSON decoding (xgrammar) and presence/frequency penalties, at the engine level.

The grammar tests use the real tokenizer of the embedded model; the generation ones its real model.
"""
import json

import jsonschema
import pytest
import torch

from tests.support.fakes import CharTokenizer, ScriptedRunner
from worker.engine.hf_engine import HFEngine
from worker.engine.sampler import make_generator, sample
from worker.engine.sequence import EngineRequest, ResponseFormat, Sampling
from worker.engine.structured import StructuredOutput
from worker.engine_request import engine_sampling

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pet": {"type": "string", "enum": ["cat", "dog", "none"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}
SCHEMA = ResponseFormat("json_schema", json.dumps(PERSON))


@pytest.fixture(scope="module")
def tokenizer(model_ref):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_ref.path)


@pytest.fixture(scope="module")
def structured(tokenizer, model_ref):
    config = json.loads((model_ref.path / "config.json").read_text())
    return StructuredOutput.from_tokenizer(tokenizer, config["vocab_size"], {tokenizer.eos_token_id})


def token_of(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, ids
    return ids[0]


def test_mask_allows_only_tokens_that_continue_the_json(structured, tokenizer):
    matcher = structured.matcher(SCHEMA)
    logits = torch.zeros(2, structured.vocab_size)
    structured.mask(logits, [matcher, None])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert tokenizer.decode(allowed[:1]).startswith("{") and token_of(tokenizer, "{") in allowed
    assert token_of(tokenizer, "Hello") not in allowed and tokenizer.eos_token_id not in allowed
    assert torch.isfinite(logits[1]).all()  # an unconstrained row is untouched


def test_stop_token_is_allowed_only_once_the_json_is_complete(structured, tokenizer):
    matcher = structured.matcher(ResponseFormat("json_object"))
    for token in tokenizer.encode('{"a": [1, 2]}', add_special_tokens=False):
        logits = torch.zeros(1, structured.vocab_size)
        structured.mask(logits, [matcher])
        assert logits[0, tokenizer.eos_token_id] == float("-inf")
        assert matcher.accept_token(token)
    logits = torch.zeros(1, structured.vocab_size)
    structured.mask(logits, [matcher])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [tokenizer.eos_token_id]


def test_json_object_mode_refuses_a_top_level_array(structured, tokenizer):
    matcher = structured.matcher(ResponseFormat("json_object"))
    assert not matcher.accept_token(token_of(tokenizer, "["))


def test_a_schema_the_grammar_cannot_enforce_is_a_value_error(structured):
    with pytest.raises(ValueError, match="response_format"):
        structured.matcher(ResponseFormat("json_schema", "{not json"))


def test_engine_refuses_json_requests_without_structured_support():
    engine = HFEngine(ScriptedRunner({"a": "x"}), CharTokenizer())
    with pytest.raises(ValueError, match="response_format"):
        engine.add_request(EngineRequest("a", [1], Sampling(response_format=SCHEMA)))


def test_job_record_sampling_becomes_engine_sampling():
    sampling = engine_sampling({"max_tokens": 9, "temperature": 0.5, "top_p": 1.0, "top_k": 0, "seed": 3,
                                "stop": ["x"], "presence_penalty": 0.5, "frequency_penalty": -1.0,
                                "response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "p", "schema": PERSON}}})
    assert sampling.stop == ("x",) and sampling.frequency_penalty == -1.0
    assert sampling.response_format.kind == "json_schema"
    assert json.loads(sampling.response_format.schema) == PERSON
    plain = engine_sampling({"max_tokens": 9, "stop": []})  # a record from before this change
    assert plain.response_format is None and plain.presence_penalty == 0



def test_a_sampled_job_without_a_seed_samples_alike_in_every_attempt():
    """Seeded from its id: an attempt that starts over after a crash says again what was sent."""
    sampled = {"max_tokens": 9, "temperature": 0.8, "stop": []}
    first, again = engine_sampling(sampled, "job-a"), engine_sampling(sampled, "job-a")
    assert first.seed is not None and first.seed == again.seed
    assert engine_sampling(sampled, "job-b").seed != first.seed  # other jobs sample otherwise
    assert engine_sampling({**sampled, "seed": 7}, "job-a").seed == 7  # the client's seed stands
    assert engine_sampling({**sampled, "temperature": 0.0}, "job-a").seed is None  # greedy needs none

# --- penalties ------------------------------------------------------------------------------

def pick(logits, history, **params):
    sampling = Sampling(temperature=0, **params)
    return sample(torch.tensor([logits]), [sampling], [make_generator(sampling)], [history])[0]


def test_presence_penalty_applies_once_per_token_already_generated():
    assert pick([3.0, 2.5], [0, 0, 0]) == 0
    assert pick([3.0, 2.5], [0], presence_penalty=1.0) == 1
    assert pick([3.0, 2.5], [0, 0, 0], presence_penalty=0.4) == 0  # not per occurrence


def test_frequency_penalty_grows_with_each_occurrence():
    assert pick([3.0, 2.5], [0], frequency_penalty=0.3) == 0  # 2.7 > 2.5
    assert pick([3.0, 2.5], [0, 0], frequency_penalty=0.3) == 1  # 2.4 < 2.5
    assert pick([2.5, 3.0], [0], frequency_penalty=-1.0) == 0  # negative: repeat more


def test_penalties_are_per_row():
    params = [Sampling(temperature=0, presence_penalty=2.0), Sampling(temperature=0)]
    logits = torch.tensor([[3.0, 2.5], [3.0, 2.5]])
    assert sample(logits, params, [make_generator(p) for p in params], [[0], [0]]) == [1, 0]


# --- the real model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_engine(model_ref, tokenizer, structured):
    from common.prompting import PromptBuilder
    from worker.engine.runner_hf import HFModelRunner

    torch.set_num_threads(2)
    runner = HFModelRunner(model_ref.path)
    return HFEngine(runner, tokenizer, structured=structured), PromptBuilder(model_ref.path, 4096)


def run(engine):
    texts, finals = {}, {}
    while engine.has_unfinished():
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
            if out.finished:
                finals[out.request_id] = out
    return texts, finals


@pytest.mark.slow
def test_constrained_free_and_penalised_requests_share_a_batch(real_engine):
    engine, builder = real_engine
    ids = builder.build([{"role": "user", "content": "Describe a person."}], None)[1]
    engine.add_request(EngineRequest("schema", ids, Sampling(max_tokens=80, temperature=0,
                                                             response_format=SCHEMA)))
    engine.add_request(EngineRequest("object", ids, Sampling(max_tokens=200, temperature=0,
                                                             response_format=ResponseFormat("json_object"))))
    engine.add_request(EngineRequest("free", ids, Sampling(max_tokens=20, temperature=0)))
    red = builder.build(None, "red, red, red, red, red, red,")[1]
    engine.add_request(EngineRequest("repeats", red, Sampling(max_tokens=12, temperature=0)))
    engine.add_request(EngineRequest("penalised", red, Sampling(max_tokens=12, temperature=0,
                                                                frequency_penalty=2.0)))
    texts, finals = run(engine)
    person = json.loads(texts["schema"])
    jsonschema.validate(person, PERSON)
    assert finals["schema"].finish_reason == "stop"
    assert isinstance(json.loads(texts["object"]), dict) and finals["object"].finish_reason == "stop"
    assert not texts["free"].lstrip().startswith("{")  # the free row was not constrained
    assert texts["repeats"].count("red") > texts["penalised"].count("red")
    assert engine.runner.rows == []
