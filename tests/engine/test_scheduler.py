"""Scheduler policy, without a model."""
import pytest

from worker.engine.scheduler import Scheduler
from worker.engine.sequence import EngineRequest, Sampling, Sequence, SeqState


def seq(rid: str, prompt_len: int = 4, max_tokens: int = 8) -> Sequence:
    return Sequence(EngineRequest(rid, list(range(1, prompt_len + 1)), Sampling(max_tokens=max_tokens)))


def test_admits_up_to_max_batch_size_then_decodes():
    s = Scheduler(max_batch_size=2, kv_budget_tokens=1000)
    a, b, c = seq("a"), seq("b"), seq("c")
    for x in (a, b, c):
        s.add(x)
    first = s.schedule()
    assert [x.id for x in first.prefill] == ["a", "b"] and not first.decode
    second = s.schedule()
    assert not second.prefill and [x.id for x in second.decode] == ["a", "b"]
    assert c.state is SeqState.WAITING


def test_finished_sequence_frees_its_slot_for_the_next_waiting_one():
    s = Scheduler(max_batch_size=2, kv_budget_tokens=1000)
    a, b, c = seq("a"), seq("b"), seq("c")
    for x in (a, b, c):
        s.add(x)
    s.schedule()
    s.finish(a, "stop")
    joined = s.schedule()
    assert [x.id for x in joined.prefill] == ["c"]
    assert [x.id for x in s.running] == ["b", "c"]


def test_kv_budget_counts_rows_times_longest_reservation_and_keeps_fifo_order():
    s = Scheduler(max_batch_size=8, kv_budget_tokens=35)
    first = seq("first", prompt_len=10, max_tokens=5)  # reserves 15
    big, small = seq("big", prompt_len=10, max_tokens=10), seq("small", prompt_len=2, max_tokens=2)
    for x in (first, big, small):
        s.add(x)
    assert [x.id for x in s.schedule().prefill] == ["first"]  # 2 rows x 20 > 35: big waits, small too
    assert s.kv_tokens_needed() == 15
    s.finish(first, "stop")
    assert [x.id for x in s.schedule().prefill] == ["big"]  # 2 rows x 20 > 35 again
    s.finish(big, "stop")
    assert [x.id for x in s.schedule().prefill] == ["small"]


def test_request_larger_than_budget_is_rejected():
    with pytest.raises(ValueError, match="KV tokens"):
        Scheduler(4, kv_budget_tokens=10).add(seq("x", prompt_len=8, max_tokens=8))


def test_finish_removes_waiting_sequence_too():
    s = Scheduler(1, 100)
    a, b = seq("a"), seq("b")
    s.add(a)
    s.add(b)
    s.finish(b, "cancelled")
    assert list(s.waiting) == [a] and b.state is SeqState.FINISHED and b.finish_reason == "cancelled"
    assert s.find("a") is a and s.find("b") is None


def test_prefill_budget_splits_a_burst_and_keeps_short_prompts_unpadded():
    s = Scheduler(max_batch_size=8, kv_budget_tokens=10_000, max_prefill_tokens=100)
    long1, long2 = seq("long1", prompt_len=80), seq("long2", prompt_len=80)
    shorts = [seq(f"s{i}", prompt_len=10) for i in range(5)]
    for x in (long1, long2, *shorts):
        s.add(x)
    assert [x.id for x in s.schedule().prefill] == ["long1"]  # alone: 2 x 80 > 100
    assert [x.id for x in s.schedule().prefill] == ["long2"]  # long2 + s0 would pad s0 to 80
    assert [x.id for x in s.schedule().prefill] == [f"s{i}" for i in range(5)]  # 5 x 10


def test_prefill_cost_can_discount_cached_prefixes():
    s = Scheduler(8, 10_000, max_prefill_tokens=100, prefill_cost=lambda prompt: len(prompt) - 70)
    for i in range(4):
        s.add(seq(f"x{i}", prompt_len=80))  # 10 uncached tokens each
    assert len(s.schedule().prefill) == 4
