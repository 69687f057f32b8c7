"""The OpenVINO adapter's admission gate on its own (no OpenVINO): which waiting requests the core
may take, by KV room and by prompt starts still being prefilled. test_openvino_engine.py checks
the same rules against the real pipeline."""
from __future__ import annotations

from worker.engine.openvino_gate import SHARED_START_TOKENS, WARM_STARTS, AdmissionGate
from worker.engine.sequence import EngineRequest, Sampling


def request(request_id: str, prompt_tokens: int = 10, max_tokens: int = 30, start: int = 0) -> EngineRequest:
    """A request needing `prompt_tokens + max_tokens` of KV room; prompts longer than
    SHARED_START_TOKENS with the same `start` share their first tokens."""
    prompt = [start] * min(prompt_tokens, SHARED_START_TOKENS) + [7] * max(0, prompt_tokens - SHARED_START_TOKENS)
    return EngineRequest(request_id, prompt, Sampling(max_tokens=max_tokens))


def ids(requests: list[EngineRequest]) -> list[str]:
    return [r.request_id for r in requests]


def gate_with(*requests: EngineRequest, capacity: int = 100) -> AdmissionGate:
    gate = AdmissionGate(capacity)
    for r in requests:
        gate.wait(r)
    return gate


def test_requests_wait_for_kv_room_and_go_as_it_frees():
    gate = gate_with(request("r0"), request("r1"), request("r2"))  # 40 tokens each, 100 of room
    assert ids(gate.admit()) == ["r0", "r1"] and gate.in_core == {"r0", "r1"}
    gate.heard("r0", finished=False)  # a token: still holds its room
    assert gate.admit() == []
    gate.heard("r0", finished=True)
    assert ids(gate.admit()) == ["r2"] and gate.in_core == {"r1", "r2"}


def test_one_request_alone_always_goes():
    gate = gate_with(request("big", max_tokens=500), request("next"))
    assert ids(gate.admit()) == ["big"]
    gate.heard("big", finished=True)
    assert ids(gate.admit()) == ["next"]


def test_the_oldest_waiting_request_goes_first():
    """A smaller request behind one that does not fit does not pass it."""
    gate = gate_with(request("r0", max_tokens=50), request("large", max_tokens=50), request("small", max_tokens=1))
    assert ids(gate.admit()) == ["r0"]  # 60 in the core: "large" (60) does not fit, "small" (11) waits behind it


def test_an_unknown_capacity_holds_nothing_back():
    gate = gate_with(*(request(f"r{i}", max_tokens=1000) for i in range(3)), capacity=0)
    assert ids(gate.admit()) == ["r0", "r1", "r2"]


def test_prompts_that_start_alike_wait_for_the_first_ones_first_token():
    long = SHARED_START_TOKENS + 20
    gate = gate_with(*(request(f"r{i}", long, start=1) for i in range(3)), request("other"), capacity=10_000)
    assert ids(gate.admit()) == ["r0", "other"]  # r1 and r2 wait for r0's start; "other" is not held
    gate.heard("other", finished=False)
    assert gate.admit() == []
    gate.heard("r0", finished=False)  # its first token: its start is in the prefix cache
    assert ids(gate.admit()) == ["r1", "r2"]
    gate.wait(request("later", long, start=1))  # a start prefilled once goes at once
    assert ids(gate.admit()) == ["later"]


def test_prefilled_starts_are_forgotten_oldest_first():
    long = SHARED_START_TOKENS + 1
    gate = AdmissionGate(0)
    for start in range(WARM_STARTS + 1):  # start 0 is the oldest of WARM_STARTS + 1
        gate.wait(request(f"s{start}", long, start=start))
        gate.admit()
        gate.heard(f"s{start}", finished=True)
    gate.wait(request("a", long, start=WARM_STARTS))
    gate.wait(request("b", long, start=WARM_STARTS))
    assert ids(gate.admit()) == ["a", "b"]  # still remembered
    gate.wait(request("c", long, start=0))
    gate.wait(request("d", long, start=0))
    assert ids(gate.admit()) == ["c"]  # forgotten: d waits for c's prefill again


def test_a_withdrawn_request_never_goes():
    gate = gate_with(request("r0", max_tokens=80), request("r1"))
    assert ids(gate.admit()) == ["r0"]
    assert gate.withdraw("r1") is True
    assert gate.withdraw("r0") is False  # in the core: the core has to be told
    gate.heard("r0", finished=True)
    assert gate.admit() == [] and gate.in_core == set()


def test_a_request_that_ends_while_waiting_leaves_the_line():
    gate = gate_with(request("r0", max_tokens=80), request("r1"))
    gate.admit()
    gate.heard("r1", finished=True)  # failed with the rest (an engine error) before it went
    gate.heard("r0", finished=True)
    assert gate.admit() == []


def test_clear_forgets_every_request_and_names_those_in_the_core():
    long = SHARED_START_TOKENS + 1
    gate = gate_with(request("r0", long, start=1), request("r1", long, start=1), capacity=10_000)
    gate.admit()
    assert gate.clear() == ["r0"]
    assert gate.in_core == set() and gate.admit() == []
    gate.wait(request("r2", long, start=1))  # nothing prefilling any more: no wait
    assert ids(gate.admit()) == ["r2"]
