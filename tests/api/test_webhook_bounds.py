"""Nothing about a webhook holds a thread for longer than its setting says: the submit-time lookup of
its host (`webhook_dns_timeout_s`: the API answers, it does not hang), and a delivery attempt
as a whole (`webhook_timeout_s`: lookup, connect, send and the answer's headers together, however
slowly a receiver trickles its answer).

The slow receiver is a real HTTP server on 127.0.0.1 (tests/support/webhook_receiver.py); the resolver
that hangs is the process's `socket.getaddrinfo`, which never answers for names under `.hangs.test`
until the test ends."""
from __future__ import annotations

import io
import socket
import threading
import time

import pytest

from tests.support.settings import make_settings, settings_fixture
from worker.webhook_sender import WebhookSender

HANGS = ".hangs.test"
DNS_TIMEOUT_S = 0.5
ATTEMPT_S = 1.0
SLACK_S = 1.5  # for a loaded host; what is bounded takes many times longer


@pytest.fixture
def hanging_dns(monkeypatch):
    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kwargs):
        if isinstance(host, str) and host.endswith(HANGS):
            release.wait(120)
            raise socket.gaierror(socket.EAI_AGAIN, "the hanging resolver was released")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield
    release.set()  # frees the lookup threads still waiting


settings = settings_fixture(webhook_dns_timeout_s=DNS_TIMEOUT_S)


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


# --- submit time: the host's lookup ------------------------------------------------------------
def test_a_job_whose_webhook_host_never_resolves_is_refused_within_the_dns_timeout(api, hanging_dns):
    resp, took = timed(lambda: api.post("/v1/jobs", json={
        "prompt": "Say yes.", "max_tokens": 1, "webhook": f"http://receiver{HANGS}/hook"}))
    assert took < DNS_TIMEOUT_S + SLACK_S
    assert resp.status_code == 422, resp.get_data(as_text=True)
    message = resp.get_json()["error"]["message"]
    assert f"receiver{HANGS}" in message and f"no answer within {DNS_TIMEOUT_S:g} s" in message


def test_openai_and_batch_requests_naming_such_a_webhook_are_refused_within_it_too(api, hanging_dns):
    model = api.get("/ui/config").get_json()["model"]
    resp, took = timed(lambda: api.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 1,
        "webhook": f"http://chat{HANGS}/hook"}))
    assert took < DNS_TIMEOUT_S + SLACK_S
    assert resp.status_code == 400, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["param"] == "webhook" and "no answer within" in error["message"]

    upload = api.post("/v1/files", data={"purpose": "batch", "file": (io.BytesIO(
        b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n'),
        "in.jsonl")})
    assert upload.status_code == 200, upload.get_data(as_text=True)
    resp, took = timed(lambda: api.post("/v1/batches", json={
        "input_file_id": upload.get_json()["id"], "endpoint": "/v1/completions",
        "completion_window": "24h", "webhook": f"http://batch{HANGS}/hook"}))
    assert took < DNS_TIMEOUT_S + SLACK_S
    assert resp.status_code == 400, resp.get_data(as_text=True)
    error = resp.get_json()["error"]
    assert error["param"] == "webhook" and "no answer within" in error["message"]


# --- delivery: one attempt ---------------------------------------------------------------------
@pytest.fixture
def sender():
    return WebhookSender(make_settings(webhook_timeout_s=ATTEMPT_S), webhooks=None)  # post() records nothing


def test_an_attempt_ends_within_its_timeout_however_slowly_the_receiver_trickles(sender, receiver):
    """Each byte of the answer comes 0.15 s after the one before, well within a read's timeout;
    the whole status line and headers would take 6 s. The attempt ends at its 1 s bound."""
    receiver.script((200, {}, 0, 0.15))
    outcome, took = timed(lambda: sender.post({"id": "msg_trickle", "url": receiver.url, "body": "{}"}))
    assert len(receiver.requests) == 1  # it was sent, and the answer had begun
    assert outcome.status is None and outcome.error.startswith("timed out"), outcome
    assert ATTEMPT_S - 0.05 <= took < ATTEMPT_S + SLACK_S


def test_a_prompt_answer_is_not_cut(sender, receiver):
    receiver.script((204, {}, 0.3))
    outcome, took = timed(lambda: sender.post({"id": "msg_quick", "url": receiver.url, "body": "{}"}))
    assert outcome.status == 204 and outcome.error is None


def test_an_attempt_whose_host_never_resolves_ends_within_its_timeout(sender, hanging_dns):
    outcome, took = timed(lambda: sender.post({"id": "msg_dns", "url": f"http://receiver{HANGS}/hook",
                                               "body": "{}"}))
    assert took < ATTEMPT_S + SLACK_S
    assert outcome.status is None and not outcome.final and "no answer within" in outcome.error, outcome
