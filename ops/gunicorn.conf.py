"""gunicorn's settings for llmq's API: `gunicorn -c ops/gunicorn.conf.py -b HOST:PORT api.wsgi:app`.

The API runs on gevent workers: under load most streams are jobs waiting in the queue, and a
waiting stream then costs a greenlet and a socket, not a thread, so one process holds thousands
and answers each at once (docs/front-door.md says why this model and what it measured). Every
blocking call of the API is a socket call (Redis, the broker, DNS), which gevent makes
cooperative; there is no CPU-heavy work on a request's path beyond validating one request.

Any setting here can still be overridden on the command line (e.g. `-w 4`, or `-k gthread
--threads 64` for the thread-per-request model the benchmark compares against).
"""
from __future__ import annotations

import resource

from common.settings import get_settings

_settings = get_settings()

worker_class = "gevent"
workers = 1
# Room for every stream the per-process limit allows plus plain requests, so a client over the
# limit is answered 503 at once instead of waiting, unaccepted, in the listen backlog.
worker_connections = _settings.max_streams_per_process + 1024
backlog = 4096  # a burst of thousands of connects (the kernel caps it at net.core.somaxconn)
timeout = 60  # a gevent worker's heartbeat runs in its hub: this only catches a process stuck in CPU
graceful_timeout = 30
keepalive = 75  # seconds an idle keep-alive connection is kept (above common proxies' 60 s)
# gunicorn's control socket has one default path per user, which several APIs on a host would
# share; llmq's ops scripts manage the API by its pid instead
control_socket_disable = True

# Each open stream is one socket; the Redis pool adds up to 512 and the broker a few.
OPEN_FILES_NEEDED = worker_connections + 1024


def on_starting(server) -> None:
    """Raise the soft open-file limit toward the hard one, as far as the streams need: the usual
    default of 1,024 would refuse connections long before `max_streams_per_process`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES_NEEDED if hard == resource.RLIM_INFINITY else min(OPEN_FILES_NEEDED, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        soft = wanted
    if soft != resource.RLIM_INFINITY and soft < OPEN_FILES_NEEDED:
        server.log.warning("open-file limit %d is below the %d that %d streams need: raise the hard "
                           "limit (ulimit -Hn, LimitNOFILE=, docker --ulimit nofile=)", soft,
                           OPEN_FILES_NEEDED, _settings.max_streams_per_process)
