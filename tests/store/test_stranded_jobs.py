"""When a worker sends spare tickets for queued jobs whose own ticket was lost (pure, no Redis)."""
from common.scheduling.stranded import StrandedJobs


def test_spare_tickets_only_for_what_is_seen_on_two_heartbeats_in_a_row():
    stranded = StrandedJobs()
    assert stranded.spare_tickets(waiting=3, tickets_waiting=0, free_slots=8) == 0  # maybe in flight
    assert stranded.spare_tickets(waiting=3, tickets_waiting=0, free_slots=8) == 3  # lost: one each
    assert stranded.spare_tickets(waiting=3, tickets_waiting=0, free_slots=8) == 0  # seen twice again
    assert stranded.spare_tickets(waiting=5, tickets_waiting=0, free_slots=2) == 2  # at most the free slots


def test_no_spare_tickets_while_tickets_wait_or_the_worker_is_full_or_nothing_waits():
    stranded = StrandedJobs()
    for waiting, tickets, free in [(3, 1, 8), (3, 0, 0), (0, 0, 8)]:
        assert stranded.spare_tickets(waiting, tickets, free) == 0
        assert stranded.spare_tickets(waiting, tickets, free) == 0
    # a condition that clears in between starts the count again
    assert stranded.spare_tickets(2, 0, 8) == 0
    assert stranded.spare_tickets(2, 1, 8) == 0
    assert stranded.spare_tickets(2, 0, 8) == 0
    assert stranded.spare_tickets(2, 0, 8) == 2
