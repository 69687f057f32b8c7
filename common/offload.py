"""CPU-bound work of a request, run where it does not hold up the process's other requests.

Under gevent (the API's server, ops/gunicorn.conf.py) every request of a process shares one OS
thread: a request that computes for half a second (tokenizing a prompt of a megabyte) holds every
open stream of the process for as long. Work that releases the GIL while it computes (the Rust
tokenizer's batch encode) runs in gevent's pool of native threads instead, and the streams go on;
under threads (another server, the tests' in-process one) it simply runs in the caller's thread.

Small work stays in the caller: handing it to a thread and back costs more than doing it, most of
all under a burst of requests, when each of them waits for a pool thread and then for the GIL
(docs/front-door.md).
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TypeVar

from tokenizers import Encoding, Tokenizer

T = TypeVar("T")
INLINE_CHARS = 2_000  # text encoded in the caller: about half a millisecond of the tokenizer's time


def off_the_loop(fn: Callable[..., T], *args) -> T:
    """`fn(*args)`, in a native thread when the process runs on gevent."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        import gevent

        return gevent.get_hub().threadpool.apply(fn, args)
    return fn(*args)


def encode_batch(tokenizer: Tokenizer, texts: list[str], add_special_tokens: bool) -> list[Encoding]:
    """`tokenizer.encode_batch(texts)`, in the caller when the texts are short, else off the loop
    (the batch form releases the GIL while it computes; the single one does not)."""
    encode = functools.partial(tokenizer.encode_batch, add_special_tokens=add_special_tokens)
    return encode(texts) if sum(map(len, texts)) <= INLINE_CHARS else off_the_loop(encode, texts)
