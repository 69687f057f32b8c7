"""The Redis broker transport llmq uses: kombu's, made to survive a Redis outage under a worker
that is running jobs.

Seen with celery/kombu 5.7 (cf. kombu#970, #582): when the broker connection drops, Celery closes
the consumer's channel after the transport has let go of its client. Two things then raise
AttributeError and stop the worker ("Unrecoverable error: 'NoneType' object has no attribute
'hostname'" / "'client'"): re-queueing the channel's unacked messages on close, and acking, once
Redis is back, a job that was running across the outage. So this channel
- does not re-queue on close: a message no live worker renews is redelivered by Redis after the
  visibility timeout anyway (`worker.lease`), and the job's lease decides whether it runs again;
- keeps the connection parameters it was opened with, so a late ack reaches Redis (an ack is just
  the removal of the message from Redis's unacked set, valid on any connection).
"""
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    do_restore = False

    def __init__(self, *args, **kwargs):
        self._opened_with: dict[bool, dict] = {}
        super().__init__(*args, **kwargs)
        self._connparams(asynchronous=False)

    def _connparams(self, asynchronous=False):
        transport = self.connection
        if transport is not None and transport.client is not None:
            self._opened_with[asynchronous] = super()._connparams(asynchronous=asynchronous)
        return dict(self._opened_with[asynchronous])


class Transport(kombu_redis.Transport):
    Channel = Channel
