"""API keys as configured: who may call, at which tier, within which limits.

Keys are entries `id:sha256hex[:tier=high|normal|low][:rpm=N][:concurrent=N][:streams=N][:weight=N]`,
given in `LLMQ_API_KEYS` (comma-separated) and/or `LLMQ_API_KEYS_FILE` (one per line, `#` comments). Only
the SHA-256 of a key is configured or stored anywhere; `python -m api.auth new <id>` makes a key
and prints its entry. With no entries, auth is off and every caller is anonymous. The API
authenticates with them (api/auth.py); a batch's lines get their key's fair-share weight from them.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from common.schemas import Priority
from common.settings import Settings

PRIORITY_ORDER: tuple[Priority, ...] = ("low", "normal", "high")
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class KeyConfigError(ValueError):
    """A malformed key entry; raised at start-up, never at request time."""


@dataclass(frozen=True)
class ApiKey:
    id: str
    digest: str  # sha256 hex of the key
    tier: Priority = "normal"  # the highest priority this key may ask for, and its default
    rpm: int | None = None  # job submissions per minute; None: the server default
    concurrent: int | None = None  # jobs queued or running at once; None: the server default
    streams: int | None = None  # open streams at once; None: the server default
    weight: float = 1.0  # fair share of the queue against other keys (common/scheduling/fair_queue.py)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_entry(entry: str) -> ApiKey:
    """'alice:<64 hex>:tier=high:rpm=60' -> ApiKey"""
    key_id, _, rest = entry.strip().partition(":")
    digest, *options = rest.split(":")
    if not _ID.match(key_id):
        raise KeyConfigError(f"key id {key_id!r}: use 1-64 of A-Z a-z 0-9 _ . -")
    if not _DIGEST.match(digest.lower()):
        raise KeyConfigError(f"key {key_id!r}: expected the key's sha256 as 64 hex digits "
                             "(see `python -m api.auth new`)")
    fields: dict = {}
    for option in options:
        name, _, value = option.partition("=")
        if name == "tier" and value in PRIORITY_ORDER:
            fields["tier"] = value
        elif name in ("rpm", "concurrent", "streams") and value.isdigit():
            fields[name] = int(value)
        elif name == "weight" and _positive_number(value):
            fields[name] = float(value)
        else:
            raise KeyConfigError(f"key {key_id!r}: bad option {option!r} "
                                 "(tier=high|normal|low, rpm=N, concurrent=N, streams=N, weight=N)")
    return ApiKey(key_id, digest.lower(), **fields)


def _positive_number(value: str) -> bool:
    try:
        return 0 < float(value) < float("inf")
    except ValueError:
        return False


def load_keys(settings: Settings) -> dict[str, ApiKey]:
    """All configured keys, by digest."""
    entries = [e for e in settings.api_keys.split(",") if e.strip()]
    if settings.api_keys_file:
        lines = settings.api_keys_file.read_text().splitlines()
        entries += [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    keys: dict[str, ApiKey] = {}
    for key in map(parse_entry, entries):
        if key.id in {k.id for k in keys.values()} or key.digest in keys:
            raise KeyConfigError(f"key {key.id!r} is configured twice")
        keys[key.digest] = key
    return keys
