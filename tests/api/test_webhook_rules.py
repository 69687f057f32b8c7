"""Webhook rules without a control worker: signatures (checked against the reference
`standardwebhooks` package), URL and address rules, the API's answers to a bad webhook, the retry
arithmetic, and the delivery record's attempt fence on the real Redis."""
from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timezone

import pytest
import redis

from common.webhook_rules import WebhookUrlError, address_allowed, secret_keys, sign, split_url
from common.webhooks import Webhooks, job_event_data, validate_webhook_url
from tests.support.settings import WEBHOOK_SECRETS, cleanup_namespace, make_settings, settings_fixture
from worker.webhook_sender import backoff, max_countdown, parse_retry_after

standardwebhooks = pytest.importorskip("standardwebhooks")


def test_signature_verifies_with_the_reference_library_for_each_secret():
    body = json.dumps({"type": "job.completed", "data": {"text": "héllo"}}).encode()
    timestamp = int(time.time())
    header = sign(secret_keys(" ".join(WEBHOOK_SECRETS)), "msg_abc", timestamp, body)
    assert len(header.split(" ")) == 2 and all(s.startswith("v1,") for s in header.split(" "))
    headers = {"webhook-id": "msg_abc", "webhook-timestamp": str(timestamp), "webhook-signature": header}
    for secret in WEBHOOK_SECRETS:  # a receiver holding either secret (old or new) accepts it
        assert standardwebhooks.Webhook(secret).verify(body, headers)["data"]["text"] == "héllo"
        reference = standardwebhooks.Webhook(secret).sign(
            "msg_abc", datetime.fromtimestamp(timestamp, timezone.utc), body.decode())
        assert reference in header.split(" ")
    other = "whsec_" + base64.b64encode(b"another secret, 32 bytes long...").decode()
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(other).verify(body, headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):  # body tampered with
        standardwebhooks.Webhook(WEBHOOK_SECRETS[0]).verify(body + b" ", headers)


def test_spec_vector():
    """The example from the Standard Webhooks spec's reference tests, computed by hand."""
    key = secret_keys("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    assert sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}') == \
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize("bad", ["nope", "whsec_!!!", "whsec_c2hvcnQ="])
def test_bad_secrets_are_refused_at_start(bad):
    with pytest.raises(ValueError, match="webhook secret"):
        make_settings(webhook_secrets=bad)


def test_bad_allowed_networks_are_refused_at_start():
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 network"):
        make_settings(webhook_allow_networks="10.0.0.0/8, nope")


@pytest.mark.parametrize("url, reason", [
    ("ftp://example.com/x", "only http and https"),
    ("http:///path", "no host"),
    ("http://user:pw@203.0.113.9/x", "credentials"),
    ("http://[::1", "not a valid URL"),
    ("http://8.8.8.8/a b", "whitespace"),
    ("http://8.8.8.8/#frag", "fragment"),
    ("http://8.8.8.8:99999/", "not a valid URL"),
])
def test_malformed_urls(url, reason):
    with pytest.raises(WebhookUrlError, match=reason):
        split_url(url)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1",
                                     "169.254.169.254", "0.0.0.0", "100.64.0.1", "::1", "fe80::1",
                                     "fc00::1", "::ffff:127.0.0.1", "224.0.0.1", "255.255.255.255"])
def test_non_public_addresses_are_refused(address):
    assert not address_allowed(address, "")


def test_public_and_explicitly_allowed_addresses():
    assert address_allowed("8.8.8.8", "") and address_allowed("2606:4700:4700::1111", "")
    assert address_allowed("127.0.0.1", "127.0.0.0/8")
    assert address_allowed("::ffff:127.0.0.1", "127.0.0.0/8")  # the IPv4 address it names
    assert not address_allowed("10.0.0.1", "127.0.0.0/8")


def test_validate_resolves_names_and_needs_a_secret():
    public = make_settings(webhook_allow_networks="")
    assert validate_webhook_url("https://8.8.8.8/hook", public) == "https://8.8.8.8/hook"  # no DNS
    with pytest.raises(WebhookUrlError, match="resolves to 127.0.0.1"):
        validate_webhook_url("http://localhost:8300/hook", public)  # a name for loopback
    with pytest.raises(WebhookUrlError, match="not enabled"):
        validate_webhook_url("https://8.8.8.8/hook", make_settings(webhook_secrets=""))


# The API's: public webhook addresses only, as in production.
settings = settings_fixture(webhook_allow_networks="")


@pytest.mark.parametrize("body, field, message", [
    ({"webhook": "http://127.0.0.1:8300/hook"}, "webhook", "127.0.0.1"),
    ({"webhook": "http://169.254.169.254/latest"}, "webhook", "not allowed"),
    ({"webhook": "file:///etc/passwd"}, "webhook", "only http and https"),
    ({"webhook": "https://8.8.8.8/h", "webhook_events": ["finished"]}, "webhook_events.0", "start"),
    ({"webhook": "https://8.8.8.8/h", "webhook_events": []}, "webhook_events", "at least 1"),
    ({"webhook_events": ["start"]}, "body", "needs a webhook URL"),
])
def test_jobs_api_refuses_bad_webhooks_with_422(api, body, field, message):
    response = api.post("/v1/jobs", json={"prompt": "hi", **body})
    assert response.status_code == 422, response.json
    error = response.json["error"]
    assert error["type"] == "validation_error" and message in error["message"]
    assert field in [d["field"] for d in error["details"]]


def test_openai_api_refuses_a_private_webhook_with_400(api):
    response = api.post("/v1/chat/completions", json={
        "model": "embedded", "messages": [{"role": "user", "content": "hi"}],
        "webhook": "http://10.0.0.7/hook"})
    assert response.status_code == 400
    assert response.json["error"]["param"] == "webhook" and "10.0.0.7" in response.json["error"]["message"]


def test_backoff_grows_with_jitter_and_retry_after_parses():
    settings = make_settings(webhook_backoff_s=1.0, webhook_backoff_max_s=8.0)
    for attempt, full in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)):
        delays = {backoff(settings, attempt) for _ in range(20)}
        assert all(full / 2 <= d <= full for d in delays) and len(delays) > 1
    assert parse_retry_after("7") == 7.0 and parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert 50 < parse_retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT",
                                                time.gmtime(time.time() + 60))) <= 61
    assert max_countdown(make_settings(visibility_timeout_s=120)) == 60


def test_delivery_records_once_per_subject_event_and_fences_attempts():
    settings = make_settings()
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)

    class NoBroker:  # this test is about the record; the queueing is tested with a worker
        def send_task(self, *args, **kwargs):
            pass

    hooks = Webhooks(settings, client, celery=NoBroker())
    try:
        first = hooks.enqueue("job1", "job.completed", {"x": 1}, "http://127.0.0.1:8300/h")
        assert first and hooks.enqueue("job1", "job.completed", {"x": 2}, "http://127.0.0.1:8300/h") is None
        assert hooks.enqueue("job1", "job.start", {}, "http://127.0.0.1:8300/h")
        delivery = hooks.get(first)
        assert json.loads(delivery["body"])["data"] == {"x": 1} and delivery["attempts"] == 0
        assert 0 < client.ttl(settings.namespace + ":webhook:" + first) <= settings.job_ttl_s
        assert hooks.record_attempt(first, 1, state="pending", last_status_code=500)
        assert not hooks.record_attempt(first, 1, state="delivered")  # a duplicate message
        assert not hooks.record_attempt(first, 3, state="delivered")  # not the next attempt
        assert hooks.record_attempt(first, 2, state="delivered", last_status_code=200)
        assert not hooks.record_attempt(first, 3, state="pending")  # it has ended
        view = hooks.view("job1", "http://127.0.0.1:8300/h", ["start", "completed"])
        assert [d["type"] for d in view["deliveries"]] == ["job.completed", "job.start"]
        assert view["deliveries"][0]["state"] == "delivered" and view["deliveries"][0]["attempts"] == 2
        assert "body" not in view["deliveries"][0]
    finally:
        cleanup_namespace(settings)


def test_job_event_data_carries_the_final_state():
    data = job_event_data({"id": "j", "status": "succeeded", "text": "hi", "prompt_tokens": 3,
                           "completion_tokens": 2, "finish_reason": "stop"})
    assert data["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert data["text"] == "hi" and data["status"] == "succeeded" and data["object"] == "job"


def test_the_readme_receiver_snippet_verifies_a_real_signature():
    """The verification code users copy from the README accepts llmq's signature with either
    rotated secret, and refuses a tampered body."""
    from tests.support import ROOT

    readme = (ROOT / "README.md").read_text()
    start = readme.index("import base64, hashlib, hmac, time")
    namespace: dict = {}
    exec(readme[start:readme.index("```", start)], namespace)
    body, timestamp = b'{"type": "job.completed"}', int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(timestamp),
               "webhook-signature": sign(secret_keys(" ".join(WEBHOOK_SECRETS)), "msg_1", timestamp, body)}
    assert all(namespace["verify"](secret, headers, body) for secret in WEBHOOK_SECRETS)
    assert not namespace["verify"](WEBHOOK_SECRETS[0], headers, body + b" ")
