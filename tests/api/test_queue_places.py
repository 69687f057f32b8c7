"""A stream's place in line (api/queue_places.py) is computed from the record its request created
the job with, not read back: a burst of a thousand new streams would read a thousand records. A
job that rides on another's generation waits where that one does, which is read."""
import pytest

from api.queue_places import QueuePlaces
from api.services import Services
from api.wakeups import JobWatcher
from tests.support.scripted_jobs import queue_job
from tests.support.settings import settings_fixture
from tests.support.waiting import wait_until

settings = settings_fixture(scope="function")


@pytest.fixture
def svc(settings):
    return Services(settings)


@pytest.fixture
def record_reads(svc):
    """The ids of every job record the places thread reads."""
    reads, get_many = [], svc.jobs.get_many
    svc.jobs.get_many = lambda ids: reads.extend(ids) or get_many(ids)
    return reads


def place_told(places: QueuePlaces, job_id: str, record: dict | None = None) -> dict:
    watcher = JobWatcher(max_heard=8)
    with places.watch(job_id, watcher, record):
        wait_until(lambda: watcher.is_set(), 5, message="no place told")
        return watcher.take_place()


def test_a_new_job_is_placed_from_its_record_and_others_are_read(svc, record_reads):
    places = QueuePlaces(svc.jobs, svc.registry, svc.model_loads, interval_s=0.05)
    first, second = (queue_job(svc.jobs, queue=svc.keys.queue("m")) for _ in range(2))
    assert place_told(places, second, svc.jobs.get(second))["queue_position"] == 2
    assert record_reads == []
    assert place_told(places, second)["queue_position"] == 2  # a stream of a job it did not create
    assert record_reads == [second]
    record_reads.clear()
    svc.redis.hset(svc.keys.job(second), "coalesced_into", first)  # as if it rode on `first`
    assert place_told(places, second, svc.jobs.get(second))["queue_position"] == 1  # where `first` waits
    assert record_reads == [second, first]
