"""llmq's Lua scripts, one file each beside this module, and the one way to load them.

Each script's header says what it does, its KEYS and ARGV and what it returns. Helpers shared by
several scripts live in `*_lib.lua` files (and the job key layout in `job_keys.lua`); a script
pulls one in with a line `--#include <name>`, so each helper is written once. Scripts are
registered once per Redis client: redis-py then calls them by SHA and reloads one that the server
has lost (a restart, a failover).
"""
from __future__ import annotations

import functools
import re
import threading
import weakref
from pathlib import Path

import redis
from redis.commands.core import Script

_DIR = Path(__file__).parent
_INCLUDE = re.compile(r"^--#include (\w+)$", re.MULTILINE)
_registered: weakref.WeakKeyDictionary[redis.Redis, dict[str, Script]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@functools.cache
def source(name: str) -> str:
    """The script `name` (common/lua/<name>.lua) with its includes in place."""
    text = (_DIR / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda match: source(match.group(1)), text)


def script(client: redis.Redis, name: str) -> Script:
    """The script `name`, registered with `client`; call it with `keys=[...]` and `args=[...]`."""
    with _lock:
        scripts = _registered.setdefault(client, {})
        if name not in scripts:
            scripts[name] = client.register_script(source(name))
        return scripts[name]
