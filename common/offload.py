"""CPU-bound work of a request, run where it does not hold up the process's other requests.

Under gevent (the API's server, ops/gunicorn.conf.py) every request of a process shares one OS
thread: a request that computes for half a second (tokenizing a prompt of a megabyte) holds every
open stream of the process for as long. Work that releases the GIL while it computes (the Rust
tokenizer's batch encode) runs in gevent's pool of native threads instead, and the streams go on;
under threads (another server, the tests' in-process one) it simply runs in the caller's thread.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def off_the_loop(fn: Callable[..., T], *args) -> T:
    """`fn(*args)`, in a native thread when the process runs on gevent."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        import gevent

        return gevent.get_hub().threadpool.apply(fn, args)
    return fn(*args)
