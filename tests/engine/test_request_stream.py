"""A request's stream of outputs, from the engine loop to the worker's relay (no Redis, no model).

The relay does not wait on each job's stream: it listens, and is woken only for outputs that cannot
wait for its next tick (the first ones, the end of a request, a poke); the others gather and are
drained together, so that several decode steps cost one relay write. The stream's clock here is
one the test moves, so "when" is what the test says, not what a loaded machine makes of it.
"""
import math

from worker.engine.loop import RequestStream
from worker.engine.sequence import RequestOutput


class ManualClock:
    """A monotonic clock that stands still until the test sets it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def output(text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", text, [ord(c) for c in text], finished=finished,
                         finish_reason="stop" if finished else None)


def stream_and_clock() -> tuple[RequestStream, ManualClock, list[str]]:
    """A stream on a manual clock, with a listener that notes each wake-up."""
    clock, woken = ManualClock(), []
    stream = RequestStream("r", clock=clock)
    stream.listen(lambda: woken.append("woken"))
    return stream, clock, woken


def test_an_unheld_stream_wakes_its_listener_for_every_output():
    stream, _, woken = stream_and_clock()
    stream.put(output("a"))
    stream.put(output("b"))
    assert len(woken) == 2
    assert [o.text for o in stream.drain()] == ["a", "b"] and stream.drain() == []


def test_held_outputs_gather_without_a_wake_up_until_the_hold_ends():
    stream, clock, woken = stream_and_clock()
    stream.hold(0.3)
    for at, text in [(0.02, "a"), (0.06, "b"), (0.1, "c")]:
        clock.now = at
        stream.put(output(text))
    assert woken == []
    clock.now = 0.3
    stream.put(output("d"))  # the hold is over: this one wakes the listener
    assert len(woken) == 1
    assert [o.text for o in stream.drain()] == ["a", "b", "c", "d"]


def test_the_end_of_a_request_wakes_the_listener_whatever_the_hold():
    stream, clock, woken = stream_and_clock()
    stream.hold(math.inf)
    stream.put(output("a"))
    stream.put(output("b", finished=True))
    assert len(woken) == 1
    taken = stream.drain()
    assert [o.text for o in taken] == ["a", "b"] and taken[-1].finished


def test_a_poke_wakes_the_listener_with_no_output():
    stream, _, woken = stream_and_clock()
    stream.hold(math.inf)
    stream.poke()
    assert len(woken) == 1 and stream.drain() == []


def test_get_hands_out_one_output_at_a_time_in_order():
    stream = RequestStream("r")
    for text in "xyz":
        stream.put(output(text))
    assert [stream.get(timeout=1).text for _ in range(3)] == ["x", "y", "z"]
    assert stream.get(timeout=0) is None
