"""A request's stream of outputs, from the engine loop to the job thread (no Redis, no model).

The job thread takes outputs in bunches so that several decode steps cost one relay write; what
matters is that a bunch waits no longer than it was asked to, and that the end of a request is
never held back.
"""
import threading
import time

from worker.engine.loop import RequestStream
from worker.engine.sequence import RequestOutput


def output(text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", text, [ord(c) for c in text], finished=finished,
                         finish_reason="stop" if finished else None)


def take_while_putting(items: list[tuple[float, RequestOutput]], hold_s: float = 0.0):
    """Put each output at its offset (seconds from now) from another thread, as the loop does,
    while this one takes from the stream, held `hold_s` seconds from now (not held if 0).
    Returns what was taken and how long the take waited."""
    stream = RequestStream("r")
    start = time.monotonic()

    def put_all():
        for at, item in items:
            time.sleep(max(0.0, start + at - time.monotonic()))
            stream.put(item)
    putter = threading.Thread(target=put_all)
    putter.start()
    taken = stream.take(timeout=5, hold_until=start + hold_s if hold_s else 0.0)
    waited = time.monotonic() - start
    putter.join()
    return taken, waited


def test_without_a_hold_the_first_output_is_taken_as_soon_as_it_comes():
    taken, waited = take_while_putting([(0.05, output("a")), (0.5, output("b"))])
    assert [o.text for o in taken] == ["a"]
    assert 0.03 < waited < 0.4


def test_outputs_gather_until_the_hold_ends_and_are_taken_together():
    taken, waited = take_while_putting([(0.02, output("a")), (0.06, output("b")), (0.1, output("c"))],
                                       hold_s=0.3)
    assert [o.text for o in taken] == ["a", "b", "c"]
    assert 0.28 < waited < 1.0  # not woken by each output, nor kept past the hold


def test_the_end_of_a_request_is_taken_at_once_whatever_the_hold():
    taken, waited = take_while_putting([(0.02, output("a")), (0.05, output("b", finished=True))], hold_s=3)
    assert [(o.text, o.finished) for o in taken] == [("a", False), ("b", True)]
    assert waited < 1.0


def test_an_output_after_the_hold_wakes_the_reader_at_once():
    taken, waited = take_while_putting([(0.3, output("late"))], hold_s=0.05)
    assert [o.text for o in taken] == ["late"]
    assert 0.28 < waited < 0.7


def test_nothing_due_within_the_timeout_gives_an_empty_bunch_and_keeps_what_is_held():
    stream = RequestStream("r")
    start = time.monotonic()
    assert stream.take(timeout=0.1, hold_until=start + 5) == []
    assert time.monotonic() - start < 1.0
    stream.put(output("held"))
    assert stream.take(timeout=0.05, hold_until=time.monotonic() + 5) == []  # still held
    assert [o.text for o in stream.take(timeout=0.05)] == ["held"]
    assert stream.get(timeout=0.05) is None


def test_get_still_hands_out_one_output_at_a_time_in_order():
    stream = RequestStream("r")
    for text in "xyz":
        stream.put(output(text))
    assert [stream.get(timeout=1).text for _ in range(3)] == ["x", "y", "z"]
