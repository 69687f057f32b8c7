"""The one place llmq connects to Redis: every client (job store and its Lua scripts, token logs
and pub/sub, rate limits, cache, heartbeats) and the Celery broker/result URLs (workers, API,
Flower) come from here, so a plain Redis and a Sentinel-managed one are one setting apart.

With `LLMQ_REDIS_SENTINELS` set, clients ask the sentinels for the current master of
`LLMQ_REDIS_MASTER_NAME` whenever they (re)connect, trying each sentinel in turn (a first sentinel
that is down is skipped, the trap of celery#5538). After a failover:
- a connection to the dead master fails; redis-py retries the command on a new connection, which
  asks the sentinels again and reaches the promoted replica;
- a connection to a demoted master that came back as a replica answers writes with READONLY;
  redis-py's sentinel connection turns that into a connection error, drops the connection and
  retries the same way;
- while no master is known yet, commands fail with a `redis.ConnectionError` subclass, which the
  API answers with 503 + Retry-After and workers ride out like any Redis outage.
`LLMQ_REDIS_URL` still gives the database number and password; its host and port are then unused.
"""
from __future__ import annotations

from urllib.parse import quote, urlparse

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from common.settings import Settings

SENTINEL_TIMEOUT_S = 0.5  # a sentinel that does not answer within this is skipped


def client_defaults() -> dict:
    """The one set of timeouts every llmq process talks to Redis with. A few short retries absorb
    a blip; while Redis is down or a failover is under way a command fails within seconds, so the
    API answers 503 + Retry-After and workers ride the outage out in their own retry loops, rather
    than a caller hanging on a dead socket. Nothing llmq sends blocks server-side (pub/sub waits
    with client-side timeouts), so no reply legitimately takes longer than `socket_timeout`."""
    return {"decode_responses": True, "socket_connect_timeout": 5, "socket_timeout": 10,
            "health_check_interval": 30,
            "retry": Retry(ExponentialWithJitterBackoff(cap=0.5, base=0.05), 3)}


def sentinel_addresses(settings: Settings) -> list[tuple[str, int]]:
    """`LLMQ_REDIS_SENTINELS` ("host:port,host:port") as (host, port) pairs; empty: no Sentinel."""
    pairs = []
    for item in filter(None, (part.strip() for part in settings.redis_sentinels.split(","))):
        host, _, port = item.rpartition(":")
        pairs.append((host or item, int(port) if host else 26379))
    return pairs


def _db_and_auth(settings: Settings) -> dict:
    url = urlparse(settings.redis_url)
    db = int(url.path.lstrip("/") or 0)
    return {"db": db, "username": url.username or None, "password": url.password or None}


def redis_client(settings: Settings, wait_for_connection_s: float | None = None, **options) -> redis.Redis:
    """A Redis client for llmq's data, following the master when Sentinel is configured, with
    `client_defaults()` unless `options` (redis-py's: max_connections ...) say otherwise.
    With `wait_for_connection_s`, a caller that finds all `max_connections` in use waits that long
    for one to free (then ConnectionError), where redis-py's default pool fails at once: a process
    serving thousands of requests at a time (the API) needs a bound on its sockets, not errors."""
    options = {**client_defaults(), **options}
    sentinels = sentinel_addresses(settings)
    blocking = {"timeout": wait_for_connection_s} if wait_for_connection_s is not None else {}
    if not sentinels:
        if not blocking:
            return redis.Redis.from_url(settings.redis_url, **options)
        pool = redis.BlockingConnectionPool.from_url(settings.redis_url, **blocking, **options)
        client = redis.Redis(connection_pool=pool)
        client.auto_close_connection_pool = True
        return client
    timeouts = {"socket_timeout": SENTINEL_TIMEOUT_S, "socket_connect_timeout": SENTINEL_TIMEOUT_S}
    manager = Sentinel(sentinels, sentinel_kwargs=timeouts)
    pool_class = _BlockingSentinelPool if blocking else SentinelConnectionPool
    return manager.master_for(settings.redis_master_name, redis_class=redis.Redis,
                              connection_pool_class=pool_class, **_db_and_auth(settings),
                              **blocking, **options)


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """A pool that follows the Sentinel master and makes callers wait for a free connection."""


def broker_url(settings: Settings) -> str:
    """Celery's broker URL: `LLMQ_REDIS_URL`, or one `sentinel://` URL per
    sentinel (kombu tries them in turn; the master's name is a transport option)."""
    sentinels = sentinel_addresses(settings)
    if not sentinels:
        return settings.redis_url
    auth = _db_and_auth(settings)
    login = f"{quote(auth['username'] or '')}:{quote(auth['password'])}@" if auth["password"] else ""
    return ";".join(f"sentinel://{login}{host}:{port}/{auth['db']}" for host, port in sentinels)


def sentinel_transport_options(settings: Settings) -> dict:
    """What kombu's and Celery's Sentinel transports need beside the URL (nothing without Sentinel)."""
    if not settings.redis_sentinels:
        return {}
    return {"master_name": settings.redis_master_name,
            "sentinel_kwargs": {"socket_timeout": SENTINEL_TIMEOUT_S,
                                "socket_connect_timeout": SENTINEL_TIMEOUT_S}}
