"""Engine behaviour: continuous batching, leaving and joining, aborts, errors.

The first group uses a scripted runner (no model); the last uses the real HF runner on the
embedded model to check that batched decoding gives the same tokens as decoding alone.
"""
import pytest
import torch

from tests.support.fakes import CharTokenizer, ScriptedRunner, run_to_end
from worker.engine.hf_engine import HFEngine
from worker.engine.sequence import EngineRequest, Sampling

GREEDY = Sampling(max_tokens=50, temperature=0)


def make_engine(scripts, **kw):
    runner = ScriptedRunner(scripts)
    return HFEngine(runner, CharTokenizer(), **kw), runner


def test_concurrent_requests_decode_in_one_batch_and_short_ones_leave_early():
    engine, runner = make_engine({"short": "ab", "long": "abcdefgh"})
    engine.add_request(EngineRequest("short", [1], GREEDY))
    engine.add_request(EngineRequest("long", [1], GREEDY))
    texts, finals = run_to_end(engine)
    assert texts == {"short": "ab", "long": "abcdefgh"}
    assert finals["short"].finish_reason == "stop" and finals["long"].finish_reason == "stop"
    assert ("decode", ["short", "long"]) in runner.calls
    assert runner.calls[-1] == ("decode", ["long"])  # the long one went on alone
    assert engine.stats.max_batch_size == 2


def test_request_arriving_mid_generation_joins_the_running_batch():
    engine, runner = make_engine({"first": "abcdefghij", "late": "xyz"})
    engine.add_request(EngineRequest("first", [1], GREEDY))

    def add_late(step):
        if step == 3:
            engine.add_request(EngineRequest("late", [1, 2], GREEDY))

    texts, _ = run_to_end(engine, on_step=add_late)
    assert texts == {"first": "abcdefghij", "late": "xyz"}
    assert ("prefill", ["late"]) in runner.calls
    assert ("decode", ["first", "late"]) in runner.calls


def test_abort_leaves_the_batch_at_the_next_step_others_continue():
    engine, runner = make_engine({"a": "a" * 30, "b": "b" * 5})
    engine.add_request(EngineRequest("a", [1], GREEDY))
    engine.add_request(EngineRequest("b", [1], GREEDY))
    engine.step()
    engine.step()
    engine.abort_request("a")
    outputs = engine.step()
    aborted = [o for o in outputs if o.request_id == "a"]
    assert aborted and aborted[0].finished and aborted[0].finish_reason == "cancelled"
    assert "a" not in runner.rows
    texts, finals = run_to_end(engine)
    assert finals["b"].finish_reason == "stop" and "a" not in finals


def test_max_tokens_and_stop_strings():
    engine, _ = make_engine({"len": "abcdefgh", "stop": "hello world"})
    engine.add_request(EngineRequest("len", [1], Sampling(max_tokens=3, temperature=0)))
    engine.add_request(EngineRequest("stop", [1], Sampling(max_tokens=50, temperature=0, stop=(" wor",))))
    texts, finals = run_to_end(engine)
    assert texts["len"] == "abc" and finals["len"].finish_reason == "length"
    assert finals["len"].completion_tokens == 3
    assert texts["stop"] == "hello" and finals["stop"].finish_reason == "stop"


def test_bad_request_is_refused_alone():
    engine, _ = make_engine({"ok": "ab"})
    with pytest.raises(ValueError):
        engine.add_request(EngineRequest("empty", [], GREEDY))
    engine.add_request(EngineRequest("ok", [1], GREEDY))
    assert run_to_end(engine)[0] == {"ok": "ab"}


def test_model_failure_fails_in_flight_requests_and_engine_recovers():
    engine, runner = make_engine({"a": "aaaa", "b": "bbbb", "c": "cc"})
    engine.add_request(EngineRequest("a", [1], GREEDY))
    engine.add_request(EngineRequest("b", [1], GREEDY))
    engine.step()
    original = runner.decode
    runner.decode = lambda last: (_ for _ in ()).throw(RuntimeError("boom"))
    outputs = engine.step()
    assert {o.request_id for o in outputs} == {"a", "b"}
    assert all(o.finish_reason == "error" and "boom" in o.error for o in outputs)
    runner.decode = original
    engine.add_request(EngineRequest("c", [1], GREEDY))
    assert run_to_end(engine)[0] == {"c": "cc"}


# --- the real model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_engine_parts(model_ref):
    from transformers import AutoTokenizer

    from common.prompting import PromptBuilder
    from worker.engine.runner_hf import HFModelRunner

    torch.set_num_threads(2)
    return HFModelRunner(model_ref.path), AutoTokenizer.from_pretrained(model_ref.path), \
        PromptBuilder(model_ref.path, 4096)


def chat_ids(builder, text):
    return builder.build([{"role": "user", "content": text}], None)[1]


@pytest.mark.slow
def test_batched_greedy_decoding_matches_decoding_alone(real_engine_parts):
    runner, tok, builder = real_engine_parts
    questions = ["What is the capital of France?", "Name three colours.", "Say hi."]
    params = Sampling(max_tokens=24, temperature=0)

    def alone(q):
        engine = HFEngine(runner, tok)
        engine.add_request(EngineRequest("x", chat_ids(builder, q), params))
        return run_to_end(engine)[0]["x"]

    solo = {q: alone(q) for q in questions}
    engine = HFEngine(runner, tok)
    engine.add_request(EngineRequest(questions[0], chat_ids(builder, questions[0]), params))
    engine.add_request(EngineRequest(questions[1], chat_ids(builder, questions[1]), params))

    def join_late(step):  # a shorter prompt joins two steps in, padded into the batch
        if step == 2:
            engine.add_request(EngineRequest(questions[2], chat_ids(builder, questions[2]), params))

    batched, _ = run_to_end(engine, on_step=join_late)
    assert batched == solo
    assert "Paris" in solo[questions[0]]
    assert engine.stats.max_batch_size == 3
    assert runner.rows == []  # every row released


@pytest.mark.slow
def test_seeded_sampling_is_reproducible(real_engine_parts):
    runner, tok, builder = real_engine_parts
    ids = chat_ids(builder, "Tell me a story about a fox.")
    seeded = Sampling(max_tokens=20, temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    engine = HFEngine(runner, tok)
    engine.add_request(EngineRequest("s1", ids, seeded))
    engine.add_request(EngineRequest("s2", ids, seeded))
    engine.add_request(EngineRequest("other", ids, Sampling(max_tokens=20, temperature=1.0, seed=99)))
    texts, _ = run_to_end(engine)
    assert texts["s1"] == texts["s2"]
    assert texts["s1"] != texts["other"]
