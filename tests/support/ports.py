"""Free TCP ports on 127.0.0.1 for the servers a test starts."""
from __future__ import annotations

import os
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_port() -> int:
    """A free port for a Redis server or sentinel a test starts: from `LLMQ_TEST_REDIS_PORTS`
    ("first-last", for a machine whose users share out port ranges) if set, else any free port."""
    span = os.environ.get("LLMQ_TEST_REDIS_PORTS")
    if not span:
        return free_port()
    first, last = map(int, span.split("-"))
    for port in range(first, last + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            if port not in _ports_given:
                _ports_given.add(port)
                return port
    raise RuntimeError(f"no free port left in LLMQ_TEST_REDIS_PORTS={span}")


_ports_given: set[int] = set()  # a port handed out but not yet bound by its server stays taken
