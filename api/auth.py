"""Optional API keys: who is calling, and which jobs they may touch.

Keys are configured as common/api_keys.py describes; `python -m api.auth new <id>` makes a key and
prints its entry. With no entries, auth is off and every caller is anonymous.

When on, every request outside `PUBLIC_PATHS` needs `Authorization: Bearer <key>` (401 otherwise).
The hook runs app-wide, so blueprints added later are covered too. `flask.g.api_key` (an `ApiKey`)
and `flask.g.api_key_id` name the caller for the rest of the request: job ownership, rate limits,
priority tier, fair share. Jobs record their owner's key id (never the key); a key that asks for
another key's job gets 404, as if it did not exist.
"""
from __future__ import annotations

import secrets
import sys

from flask import Flask, g, request

from common.api_keys import PRIORITY_ORDER, ApiKey, hash_key, load_keys, parse_entry
from common.errors import ApiError
from common.schemas import Priority
from common.settings import Settings

PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/metrics"})


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
