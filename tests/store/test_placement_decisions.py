"""Which model a worker loads and which it unloads for it (common/scheduling/placement.py), decided
from a fleet's state built by hand: no Redis, no engines."""
from common.scheduling.placement import Budget, FleetState, Room, Step, decide

NOW = 1000.0
TWO_MODELS = Budget(max_models=2, memory_mb=0, idle_s=10)
ONE_MODEL = Budget(max_models=1, memory_mb=0, idle_s=10)


def state(queued, held=None, **fields):
    return FleetState(now=NOW, queued={m: queued.get(m, 0) for m in "abc"}, held=held or {}, **fields)


def test_nothing_queued_nothing_to_do():
    assert decide(state({}, held={"a": NOW}), TWO_MODELS) == []


def test_with_room_the_cold_model_with_most_queued_jobs_is_loaded_and_only_that_one():
    assert decide(state({"b": 1, "c": 5}, held={"a": NOW}), TWO_MODELS) == [Step("c")]


def test_a_model_held_or_loaded_elsewhere_or_that_just_failed_here_is_not_cold():
    fleet = state({"a": 3, "b": 2, "c": 1}, served=frozenset("a"), loading=frozenset("b"),
                  failed_at={"c": NOW - 5})
    assert decide(fleet, TWO_MODELS) == []
    assert decide(state({"c": 1}, failed_at={"c": NOW - 31}), TWO_MODELS) == [Step("c")]


def test_without_room_only_a_model_idle_long_enough_is_unloaded_the_longest_idle_first():
    assert decide(state({"c": 1}, held={"a": NOW - 5, "b": NOW - 9}), TWO_MODELS) == []
    assert decide(state({"c": 1}, held={"a": NOW - 11, "b": NOW - 30}), TWO_MODELS) == [Step("c", unload="b")]


def test_each_cold_model_gets_a_step_in_turn_while_the_lock_may_fail():
    fleet = state({"b": 2, "c": 1}, held={"a": NOW - 20})
    assert decide(fleet, ONE_MODEL) == [Step("b", unload="a"), Step("c", unload="a")]


def test_a_worker_with_room_elsewhere_gets_one_pass_first():
    fleet = state({"b": 1}, held={"a": NOW - 20}, room_elsewhere=(Room(models=1),))
    assert decide(fleet, ONE_MODEL) == [Step("b", leave_to_others=True)]
    passed = state({"b": 1}, held={"a": NOW - 20}, room_elsewhere=(Room(models=1),), passed=frozenset("b"))
    assert decide(passed, ONE_MODEL) == [Step("b", unload="a")]
    full = state({"b": 1}, held={"a": NOW - 20}, room_elsewhere=(Room(models=0),))
    assert decide(full, ONE_MODEL) == [Step("b", unload="a")]


def test_the_memory_budget_counts_each_models_memory_here_and_elsewhere():
    budget = Budget(max_models=2, memory_mb=1000, idle_s=10)
    memory = {"a": 700, "b": 500}
    assert decide(state({"b": 1}, held={"a": NOW}, memory_mb=memory), budget) == []  # 700 + 500 > 1000
    too_small = (Room(models=1, memory_mb=100),)  # a model slot elsewhere, but not the memory
    fleet = state({"b": 1}, held={"a": NOW - 11}, memory_mb=memory, room_elsewhere=too_small)
    assert decide(fleet, budget) == [Step("b", unload="a")]
    roomy = (Room(models=1, memory_mb=600),)
    fleet = state({"b": 1}, held={"a": NOW - 11}, memory_mb=memory, room_elsewhere=roomy)
    assert decide(fleet, budget) == [Step("b", leave_to_others=True)]
