"""Optional API keys: who is calling, and which jobs they may touch.

Keys are entries `id:sha256hex[:tier=high|normal|low][:rpm=N][:concurrent=N][:streams=N][:weight=N]`,
given in `LLMQ_API_KEYS` (comma-separated) and/or `LLMQ_API_KEYS_FILE` (one per line, `#` comments). Only
the SHA-256 of a key is configured or stored anywhere; `python -m api.auth new <id>` makes a key
and prints its entry. With no entries, auth is off and every caller is anonymous.

When on, every request outside `PUBLIC_PATHS` needs `Authorization: Bearer <key>` (401 otherwise).
The hook runs app-wide, so blueprints added later are covered too. `flask.g.api_key` (an `ApiKey`)
and `flask.g.api_key_id` name the caller for the rest of the request: job ownership, rate limits,
priority tier, fair share. Jobs record their owner's key id (never the key); a key that asks for
another key's job gets 404, as if it did not exist.
"""
from __future__ import annotations

import hashlib
import re
import secrets
import sys
from dataclasses import dataclass

from flask import Flask, g, request

from api.errors import ApiError
from common.schemas import Priority
from common.settings import Settings

PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/metrics"})
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
    weight: float = 1.0  # fair share of the queue against other keys (common/fair_queue.py)


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


def init_app(app: Flask, settings: Settings) -> None:
    """Authenticate every request (when keys are configured) before it is routed."""
    keys = load_keys(settings)
    app.extensions["llmq_auth"] = keys

    @app.before_request
    def _authenticate():
        g.api_key, g.api_key_id = None, None
        if not keys or request.path in PUBLIC_PATHS:
            return
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "authentication_error",
                           "an API key is required: send 'Authorization: Bearer <key>'",
                           {"WWW-Authenticate": 'Bearer realm="llmq"'})
        key = keys.get(hash_key(token.strip()))
        if key is None:
            raise ApiError(401, "authentication_error", "invalid API key",
                           {"WWW-Authenticate": 'Bearer realm="llmq", error="invalid_token"'})
        g.api_key, g.api_key_id = key, key.id


def current_key() -> ApiKey | None:
    """The calling key, or None when auth is off."""
    return g.get("api_key")


def may_access(record: dict) -> bool:
    """Whether the caller may see or cancel this job: its owner, or anyone when auth is off."""
    key = current_key()
    return key is None or record.get("owner") == key.id


def allowed_priority(requested: Priority | None) -> Priority:
    """The job's priority: as requested, else the key's tier; above the tier is 403."""
    key = current_key()
    if key is None:
        return requested or "normal"
    if requested is None:
        return key.tier
    if PRIORITY_ORDER.index(requested) > PRIORITY_ORDER.index(key.tier):
        raise ApiError(403, "permission_denied",
                       f"priority {requested!r} is above this key's tier ({key.tier!r})")
    return requested


def _main(argv: list[str]) -> None:
    """`python -m api.auth new <id> [options]`: print a new key (shown once) and its entry."""
    if len(argv) < 2 or argv[0] != "new":
        sys.exit("usage: python -m api.auth new <id> [tier=high] [rpm=60] [concurrent=4] [streams=100] "
                 "[weight=2]")
    key = f"llmq-{secrets.token_urlsafe(32)}"
    entry = ":".join([argv[1], hash_key(key), *argv[2:]])
    parse_entry(entry)  # validate before printing
    print(f"key (give it to the client; it is not stored): {key}")
    print(f"entry (for LLMQ_API_KEYS or the keys file):   {entry}")


if __name__ == "__main__":
    _main(sys.argv[1:])
