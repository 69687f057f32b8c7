"""What a webhook may be and how it is signed: pure rules, no Redis, no Celery, no HTTP.

Signing follows the Standard Webhooks spec (standardwebhooks.com): the signed content is
`{webhook-id}.{webhook-timestamp}.{body}`, signed with HMAC-SHA256 under the base64-decoded part of
each `whsec_...` secret; `webhook-signature` lists one `v1,<base64>` per secret, space-separated,
so a receiver holding either the old or the new secret verifies during a rotation.

Addresses: a webhook may only reach public (globally routable) addresses, unless a network is
allowed in `webhook_allow_networks`; otherwise any user could make the deployment call into its
own network (Redis, metrics, cloud metadata at 169.254.169.254). The rule is applied to every
address the host resolves to when the job is submitted, and again to the address each delivery
actually connects to (a name may resolve elsewhere by then: DNS rebinding).
"""
from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hashlib
import hmac
import ipaddress
import socket
from functools import lru_cache
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
SECRET_PREFIX = "whsec_"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookUrlError(ValueError):
    """A webhook URL that is malformed or not allowed; the message says why, for the client."""


# --- signing ---------------------------------------------------------------------------------
def secret_keys(secrets: str) -> list[bytes]:
    """The HMAC keys of a space- (or comma-) separated list of `whsec_<base64>` secrets."""
    keys = []
    for secret in secrets.replace(",", " ").split():
        if not secret.startswith(SECRET_PREFIX):
            raise ValueError(f"webhook secrets start with {SECRET_PREFIX!r}")
        try:
            encoded = secret[len(SECRET_PREFIX):]
            key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        except binascii.Error:
            raise ValueError(f"a webhook secret is not {SECRET_PREFIX}<base64>") from None
        if len(key) < 16:
            raise ValueError("a webhook secret must hold at least 16 bytes (24 base64 characters)")
        keys.append(key)
    return keys


def sign(keys: list[bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header: one `v1,<base64 HMAC-SHA256>` per key."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    return " ".join("v1," + base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
                    for key in keys)


# --- addresses -------------------------------------------------------------------------------
def allowed_networks(spec: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(part.strip(), strict=False) for part in spec.split(",") if part.strip()]


def address_allowed(address: str | IPAddress, allow: str) -> bool:
    """A public unicast address, or one inside an allowed network. An IPv4 address written as
    IPv6 (::ffff:a.b.c.d) is judged as the IPv4 address it is."""
    ip = ipaddress.ip_address(address.split("%")[0] if isinstance(address, str) else address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in net for net in allowed_networks(allow)):
        return True
    return ip.is_global and not ip.is_multicast


def resolve(host: str, port: int, timeout_s: float) -> list[str]:
    """Every address `host` resolves to (an IP literal resolves to itself, without DNS), or
    socket.gaierror. The lookup runs on a small pool so that the caller waits at most
    `timeout_s`, where the system resolver may take its own timeouts times its attempts: a slow
    DNS server then holds one request for a bounded time, not an API thread or greenlet for long."""
    lookup = _dns_pool().submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        infos = lookup.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        raise socket.gaierror(f"no answer within {timeout_s:g} s") from None
    return sorted({info[4][0] for info in infos})


@lru_cache(maxsize=1)
def _dns_pool() -> concurrent.futures.ThreadPoolExecutor:
    """Built on first use, so that under gevent it is made of greenlets (patched before)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-dns")


# --- URLs ------------------------------------------------------------------------------------
def split_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a well-formed http(s) URL, or WebhookUrlError."""
    if not isinstance(url, str) or not url:
        raise WebhookUrlError("give an http(s) URL")
    if len(url) > MAX_URL_LENGTH:
        raise WebhookUrlError(f"at most {MAX_URL_LENGTH} characters")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise WebhookUrlError("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookUrlError(f"not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookUrlError(f"only http and https URLs are allowed (got {scheme or 'no'} scheme)")
    if not parts.hostname:
        raise WebhookUrlError("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlError("credentials in the URL are not supported; verify the signature instead")
    if parts.fragment:
        raise WebhookUrlError("the URL has a #fragment, which is never sent; remove it")
    return scheme, parts.hostname, port or (443 if scheme == "https" else 80)


def validate_webhook_url(url: str, allow: str, dns_timeout_s: float = 2.0) -> str:
    """The URL if it is http(s) and every address its host resolves to (within `dns_timeout_s`)
    is allowed; otherwise WebhookUrlError saying why. (`common.webhooks.validate_webhook_url`
    takes the settings.)"""
    _, host, port = split_url(url)
    try:
        addresses = resolve(host, port, dns_timeout_s)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookUrlError(f"host {host!r} does not resolve ({exc})") from None
    refused = [a for a in addresses if not address_allowed(a, allow)]
    if refused:
        raise WebhookUrlError(f"host {host!r} resolves to {', '.join(refused)}: private, loopback, "
                              "link-local and other non-public addresses are not allowed")
    return url
