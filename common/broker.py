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

The same holds for the Sentinel transport (`sentinel://` URLs), which asks the sentinels for the
current master each time it connects, so a worker follows a failover like it rides an outage.
"""
from kombu.transport import redis as kombu_redis

from common.settings import Settings


class _SurvivesOutage:
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


class Channel(_SurvivesOutage, kombu_redis.Channel):
    pass


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(_SurvivesOutage, kombu_redis.SentinelChannel):
    """Kombu's Sentinel channel reads the sentinels' addresses from its transport each time it
    makes a pool, which (as above) is gone when a message held across a failover is acked: this
    one keeps the addresses it was opened with."""

    def _sentinel_managed_pool(self, asynchronous=False):
        transport = self.connection
        if transport is not None and transport.client is not None:
            self._sentinels = [(url.hostname, url.port or transport.default_port)
                               for url in map(kombu_redis._parse_url, transport.client.alt)
                               if url.scheme == "sentinel"]
        params = {k: v for k, v in self._connparams(asynchronous).items() if k not in ("host", "port")}
        manager = kombu_redis.sentinel.Sentinel(
            self._sentinels, min_other_sentinels=getattr(self, "min_other_sentinels", 0),
            sentinel_kwargs=getattr(self, "sentinel_kwargs", None), **params)
        if asynchronous:  # kept so that kombu closes its sentinel connections with the pools
            self._async_sentinel_manager = manager
        else:
            self._sentinel_manager = manager
        login = {k: params[k] for k in ("username", "password") if k in params}
        return manager.master_for(self.master_name, kombu_redis.redis.Redis, **login).connection_pool


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def transport_for(settings: Settings) -> str:
    """The transport a worker uses for its broker URL (see `common.redis_client.broker_url`)."""
    return "common.broker:SentinelTransport" if settings.redis_sentinels else "common.broker:Transport"
