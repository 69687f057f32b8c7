"""Free TCP ports on 127.0.0.1 for the servers a test starts."""
from __future__ import annotations

import os
import socket

from tests.support.parallel import worker_count, worker_index


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_port() -> int:
    """A free port for a Redis server or sentinel a test starts: from `LLMQ_TEST_REDIS_PORTS`
    ("first-last", for a machine whose users share out port ranges) if set, else any free port.
    Under pytest-xdist each worker process takes its own slice of the range."""
    span = os.environ.get("LLMQ_TEST_REDIS_PORTS")
    if not span:
        return free_port()
    for port in _my_slice(*map(int, span.split("-"))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError(f"no free port left in LLMQ_TEST_REDIS_PORTS={span}")


def _my_slice(first: int, last: int) -> range:
    share = (last - first + 1) // worker_count()
    if share < 1:
        raise RuntimeError("LLMQ_TEST_REDIS_PORTS has fewer ports than there are xdist workers")
    start = first + worker_index() * share
    return range(start, start + share)


_ports_given: set[int] = set()  # a port handed out but not yet bound by its server stays taken
