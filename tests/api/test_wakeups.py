"""The API's one pub/sub listener: it wakes exactly the relays watching the job that grew, wakes
every relay whenever it has (re)subscribed (what was published before was not heard), survives
a Redis restart, and ends once no relay watches a job."""
import pytest
import redis

from api.wakeups import JobWakeups
from common.keys import Keys
from tests.support.processes import PrivateRedis
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_until


@pytest.fixture
def keys():
    settings = make_settings()
    yield Keys(settings.namespace), redis.Redis.from_url(settings.redis_url, decode_responses=True)
    cleanup_namespace(settings)


def test_a_publish_wakes_the_relays_watching_that_job_only(keys):
    ns, client = keys
    wakeups = JobWakeups(client, ns, linger_s=0.5, poll_s=0.1)
    with wakeups.watch("z") as first:
        # the listener has subscribed and woken the one relay watching then: the watches below
        # begin after it and hear only what is published (had they begun while it subscribed,
        # some would have been woken by that and some not, whichever came first)
        assert first.wait(5)
        with wakeups.watch("a") as a1, wakeups.watch("a") as a2, wakeups.watch("b") as b, \
                wakeups.watch("c") as c:
            client.publish(ns.channel("a"), "chunk")
            client.publish(ns.channel("c"), "chunk")  # heard after a's: messages reach the listener in order
            assert a1.wait(5) and a2.wait(5) and c.wait(5)
            assert not b.is_set()


def test_the_listener_ends_when_nobody_watches_and_a_new_watch_starts_another(keys):
    ns, client = keys
    wakeups = JobWakeups(client, ns, linger_s=0.3, poll_s=0.05)
    with wakeups.watch("a") as woken:
        assert woken.wait(5) and wakeups.listening
    wait_until(lambda: not wakeups.listening, 5)
    with wakeups.watch("a") as woken:
        assert woken.wait(5)  # the new listener's subscription wakes its relays
        woken.clear()
        client.publish(ns.channel("a"), "chunk")
        assert woken.wait(5)


def test_relays_are_woken_through_a_redis_restart(tmp_path):
    private = PrivateRedis(tmp_path)
    private.start()
    try:
        client = redis.Redis.from_url(private.url, decode_responses=True, socket_timeout=5)
        ns = Keys("wake-test")
        wakeups = JobWakeups(client, ns, poll_s=0.1)
        with wakeups.watch("a") as woken:
            assert woken.wait(5)
            woken.clear()
            private.stop()
            assert woken.wait(5)  # the listener lost Redis: the relay must read (and fail) itself
            private.start()

            def woken_again():  # once the listener has resubscribed
                woken.clear()
                return client.publish(ns.channel("a"), "chunk") and woken.wait(1)
            wait_until(woken_again, 10, message="the listener did not come back after Redis restarted")
            private.stop()
            assert woken.wait(5)
        wait_until(lambda: not wakeups.listening, 5)  # Redis is away and nobody watches: it gives up
    finally:
        private.stop()
