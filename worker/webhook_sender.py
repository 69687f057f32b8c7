"""One attempt of a webhook delivery, and what comes next. No Celery here (`worker.control` is the
glue), so it can be driven directly.

Policy: a 2xx ends the delivery; 410 Gone ends it for good (the receiver asked for no more); an
address that is not allowed ends it (it will not become allowed by waiting); anything else (another
status, a redirect, which is never followed, a timeout, a refused connection) is retried after an
exponential backoff with jitter, or after the receiver's `Retry-After` when that is later, as long
as the retry falls within `webhook_retry_horizon_s` of the event. Every attempt sends the same body under the
same `webhook-id`, with a fresh `webhook-timestamp` and signature.

An attempt, from looking up the host to reading the answer's headers, ends within
`webhook_timeout_s` in all, and reaches only allowed addresses (worker/webhook_http.py).

A wait is never slept in a thread: it is a Celery countdown. A countdown longer than half the
broker's visibility timeout is split into hops (a message that fires early just waits again), so
no message is held unacked long enough for Redis to hand it out a second time.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import urllib3
from urllib3.exceptions import NameResolutionError, NewConnectionError

from common.settings import Settings
from common.webhook_rules import secret_keys, sign, split_url
from common.webhooks import DELIVERED, FAILED, PENDING, Webhooks
from worker.webhook_http import AttemptDeadline, BlockedAddress, guarded_http

log = logging.getLogger(__name__)
USER_AGENT = "llmq-webhooks/1"


@dataclass
class Next:
    """Run `attempt` of the delivery again in `countdown` seconds."""
    attempt: int
    countdown: float


@dataclass
class Outcome:
    status: int | None = None  # the HTTP status, if the receiver answered
    error: str | None = None
    retry_after: float | None = None
    final: bool = False  # no retry whatever the horizon


def max_countdown(settings: Settings) -> float:
    """The longest Celery countdown that stays clear of Redis's redelivery of unacked messages."""
    return max(1.0, settings.visibility_timeout_s / 2)


def backoff(settings: Settings, attempt: int) -> float:
    """Delay after failed attempt `attempt` (1-based): doubling from `webhook_backoff_s`, capped,
    with 'equal jitter' (half fixed, half random) so failed deliveries do not retry in lockstep."""
    delay = min(settings.webhook_backoff_max_s, settings.webhook_backoff_s * 2 ** (attempt - 1))
    return delay / 2 + random.uniform(0, delay / 2)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (delay-seconds or an HTTP date); None if absent/bad."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class WebhookSender:
    def __init__(self, settings: Settings, webhooks: Webhooks):
        self.settings = settings
        self.webhooks = webhooks
        self.keys = secret_keys(settings.webhook_secrets)
        self.http = guarded_http(settings.webhook_allow_networks, settings.control_concurrency)

    def run(self, delivery_id: str, attempt: int) -> Next | None:
        """Make attempt `attempt` if it is due; returns when to run next, or None when done (or
        when this message is a stale duplicate: that attempt was already made)."""
        delivery = self.webhooks.get(delivery_id)
        if delivery is None or delivery["state"] != PENDING or delivery["attempts"] != attempt - 1:
            return None
        wait = delivery["next_attempt_at"] - time.time()
        if wait > 0.05:  # a hop of a long wait (or a timer a little early): not due yet
            return Next(attempt, min(wait, max_countdown(self.settings)))
        started = time.time()
        outcome = self.post(delivery)
        return self._record(delivery, attempt, started, outcome)

    def post(self, delivery: dict) -> Outcome:
        """One signed POST. Redirects are not followed; the whole attempt (lookup, connect, send,
        the answer's status and headers) takes at most `webhook_timeout_s`."""
        if not self.keys:
            return Outcome(error="webhooks are off: no signing secret is set", final=True)
        try:
            split_url(delivery["url"])  # checked at submit; checked again, settings may differ
        except ValueError as exc:
            return Outcome(error=str(exc), final=True)
        body = delivery["body"].encode()
        timestamp = int(time.time())
        headers = {"content-type": "application/json", "user-agent": USER_AGENT,
                   "webhook-id": delivery["id"], "webhook-timestamp": str(timestamp),
                   "webhook-signature": sign(self.keys, delivery["id"], timestamp, body)}
        limit = self.settings.webhook_timeout_s
        with AttemptDeadline(limit) as deadline:
            try:
                response = self.http.request("POST", delivery["url"], body=body, headers=headers,
                                             timeout=urllib3.Timeout(connect=limit, read=limit),
                                             retries=False, redirect=False, preload_content=False)
            except BlockedAddress as exc:
                return Outcome(error=str(exc), final=True)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if isinstance(exc, NameResolutionError):  # its own message says why, a lookup that
                    return Outcome(error=f"could not connect: {_reason(exc)}")  # ran out of time too
                if deadline.passed or (isinstance(exc, urllib3.exceptions.TimeoutError)
                                       and not isinstance(exc, NewConnectionError)):
                    return Outcome(error=f"timed out: the attempt took over {limit:g} s")
                return Outcome(error=f"could not connect: {_reason(exc)}")
            try:
                return _judge(response.status, response.headers)
            finally:
                response.close()

    def _record(self, delivery: dict, attempt: int, started: float, outcome: Outcome) -> Next | None:
        """Store the attempt (stamped with when it began, like its `webhook-timestamp`) and decide
        on the next: the horizon bounds when an attempt is scheduled, so one whose timer fires a
        little late still goes out rather than being dropped for the worker's own delay."""
        now = time.time()
        fields = {"last_attempt_at": started, "last_status_code": outcome.status,
                  "last_error": outcome.error, "next_attempt_at": None}
        delay = None
        if outcome.status is not None and 200 <= outcome.status < 300:
            fields["state"] = DELIVERED
        elif outcome.final:
            fields["state"] = FAILED
        else:
            # Retry-After is the earliest time to come back; the backoff still grows, so a
            # receiver answering `Retry-After: 0` is not called in a tight loop
            delay = max(outcome.retry_after or 0.0, backoff(self.settings, attempt))
            if now + delay > delivery["created_at"] + self.settings.webhook_retry_horizon_s:
                fields["state"] = FAILED
                fields["last_error"] = (f"{outcome.error}; gave up: the next attempt would fall past "
                                        f"the {self.settings.webhook_retry_horizon_s:g} s retry horizon")
                delay = None
            else:
                fields.update(state=PENDING, next_attempt_at=now + delay)
        if not self.webhooks.record_attempt(delivery["id"], attempt, **fields):
            return None  # another copy of this message recorded this attempt first
        log.info("webhook %s (%s) attempt %d: %s -> %s%s", delivery["id"], delivery["type"], attempt,
                 outcome.status or outcome.error, fields["state"],
                 f", next in {delay:.1f} s" if delay is not None else "")
        if delay is None:
            return None
        return Next(attempt + 1, min(delay, max_countdown(self.settings)))


def _judge(status: int, headers) -> Outcome:
    if 200 <= status < 300:
        return Outcome(status=status)
    if status == 410:
        return Outcome(status=status, error="410 Gone: the receiver asked for no more deliveries",
                       final=True)
    if 300 <= status < 400:
        return Outcome(status=status, error=f"redirect to {headers.get('location')!r} not followed")
    return Outcome(status=status, error=f"the receiver answered {status}",
                   retry_after=parse_retry_after(headers.get("retry-after")))


def _reason(exc: Exception) -> str:
    reason = getattr(exc, "reason", None) or exc
    return str(reason)[:300]
