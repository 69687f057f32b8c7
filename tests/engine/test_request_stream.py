"""A request's stream of outputs, from the engine loop to the job thread (no Redis, no model).

The job thread takes outputs in bunches so that several decode steps cost one relay write; what
matters is that a bunch waits until the time it was asked to and no longer, and that the end of a
request is never held back. The stream's clock here is one the test moves, so "when" is what the
test says, not what a loaded machine makes of it.
"""
import threading

from tests.support.waiting import wait_until
from worker.engine.loop import RequestStream
from worker.engine.sequence import RequestOutput

FOREVER = 3600  # a take's timeout that no test reaches: a reader that returns was woken


class ManualClock:
    """A monotonic clock that stands still until the test sets it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Reader(threading.Thread):
    """The job thread: one `take` from the stream, on a thread of its own."""

    def __init__(self, stream: RequestStream, hold_until: float = 0.0, timeout: float = FOREVER):
        super().__init__(daemon=True)
        self.stream, self.hold_until, self.timeout = stream, hold_until, timeout
        self.taken = None
        self.start()

    def run(self):
        self.taken = self.stream.take(timeout=self.timeout, hold_until=self.hold_until)

    def texts(self) -> list[str]:
        wait_until(lambda: not self.is_alive(), timeout=10, message="the reader was not woken")
        return [o.text for o in self.taken]

    def still_waits(self) -> bool:
        self.join(0.2)  # long enough for a wrongly woken reader to return
        return self.is_alive()


def output(text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", text, [ord(c) for c in text], finished=finished,
                         finish_reason="stop" if finished else None)


def stream_and_clock() -> tuple[RequestStream, ManualClock]:
    clock = ManualClock()
    return RequestStream("r", clock=clock), clock


def test_without_a_hold_the_first_output_is_taken_as_soon_as_it_comes():
    stream, clock = stream_and_clock()
    reader = Reader(stream)
    assert reader.still_waits()
    clock.now = 0.05
    stream.put(output("a"))
    assert reader.texts() == ["a"]
    stream.put(output("b"))
    assert [o.text for o in stream.take(timeout=0)] == ["b"]  # left for the next take


def test_outputs_gather_until_the_hold_ends_and_are_taken_together():
    stream, clock = stream_and_clock()
    reader = Reader(stream, hold_until=0.3)
    for at, text in [(0.02, "a"), (0.06, "b"), (0.1, "c")]:
        clock.now = at
        stream.put(output(text))
    assert reader.still_waits()  # not taken before the hold ends
    clock.now = 0.3
    assert reader.texts() == ["a", "b", "c"]  # nor kept past it


def test_the_end_of_a_request_is_taken_at_once_whatever_the_hold():
    stream, clock = stream_and_clock()
    reader = Reader(stream, hold_until=FOREVER)
    clock.now = 0.02
    stream.put(output("a"))
    clock.now = 0.05
    stream.put(output("b", finished=True))
    assert reader.texts() == ["a", "b"] and reader.taken[-1].finished
    assert clock.now < FOREVER


def test_an_output_after_the_hold_wakes_the_reader_at_once():
    stream, clock = stream_and_clock()
    reader = Reader(stream, hold_until=0.05)
    clock.now = 0.1  # the hold is over, nothing came: the reader waits for an output until its timeout
    assert reader.still_waits()
    clock.now = 0.3
    stream.put(output("late"))
    assert reader.texts() == ["late"]


def test_nothing_due_within_the_timeout_gives_an_empty_bunch_and_keeps_what_is_held():
    stream, clock = stream_and_clock()
    reader = Reader(stream, hold_until=5, timeout=0.1)
    assert reader.still_waits()
    clock.now = 0.1
    assert reader.texts() == []  # at its timeout, not at the hold
    stream.put(output("held"))
    reader = Reader(stream, hold_until=clock.now + 5, timeout=0.05)
    clock.now += 0.05
    assert reader.texts() == []  # still held
    assert [o.text for o in stream.take(timeout=0.05)] == ["held"]
    assert stream.get(timeout=0) is None


def test_get_still_hands_out_one_output_at_a_time_in_order():
    stream = RequestStream("r")
    for text in "xyz":
        stream.put(output(text))
    assert [stream.get(timeout=1).text for _ in range(3)] == ["x", "y", "z"]
