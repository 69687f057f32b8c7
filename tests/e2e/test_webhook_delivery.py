"""Webhook deliveries end to end: a real `python -m worker.control` process consuming the control
queue on the real Redis, sending to a real HTTP receiver on 127.0.0.1. The settings keep the
retries quick (backoff 0.3 s doubling, horizon 8 s; see tests/support/settings.make_settings) and the
broker's visibility timeout short, so that long waits are split into hops."""
from __future__ import annotations

import json
import time

import pytest
import redis
import requests
import standardwebhooks

from common.webhooks import Webhooks
from tests.support.settings import WEBHOOK_SECRETS, cleanup_namespace, make_settings, settings_fixture
from tests.support.waiting import wait_for_job, wait_until

pytestmark = pytest.mark.slow


settings = settings_fixture(visibility_timeout_s=6)  # waits over 3 s travel as several countdowns


@pytest.fixture(scope="module")
def hooks(settings, start_control_worker):
    start_control_worker(settings)
    return Webhooks(settings, redis.Redis.from_url(settings.redis_url, decode_responses=True))


def wait_for_state(hooks: Webhooks, delivery_id: str, timeout: float = 30) -> dict:
    """The delivery once it is no longer pending."""
    return wait_until(lambda: (delivery := hooks.get(delivery_id))["state"] != "pending" and delivery, timeout,
                      interval=0.05, message=lambda: f"delivery still pending: {hooks.get(delivery_id)}")


def verify(request: dict, secret: str = WEBHOOK_SECRETS[0]) -> dict:
    """What a receiver does: check the signature (raises if it is wrong), then read the body."""
    return standardwebhooks.Webhook(secret).verify(request["body"], request["headers"])


def test_signed_delivery_verified_with_either_rotated_secret(hooks, receiver):
    delivery_id = hooks.enqueue("subject-a", "job.completed", {"text": "hello"}, receiver.url)
    (request,) = receiver.wait_for(1)
    assert request["headers"]["webhook-id"] == delivery_id
    assert len(request["headers"]["webhook-signature"].split(" ")) == 2
    for secret in WEBHOOK_SECRETS:
        payload = verify(request, secret)
        assert payload["type"] == "job.completed" and payload["data"] == {"text": "hello"}
    delivery = wait_for_state(hooks, delivery_id)
    assert (delivery["state"], delivery["attempts"], delivery["last_status_code"]) == ("delivered", 1, 200)


def test_500_is_retried_with_the_same_webhook_id_until_2xx(hooks, receiver):
    receiver.script((500, {}, 0), (502, {}, 0))
    delivery_id = hooks.enqueue("subject-b", "job.completed", {"n": 1}, receiver.url)
    requests_ = receiver.wait_for(3)
    assert {r["headers"]["webhook-id"] for r in requests_} == {delivery_id}
    assert len({r["body"] for r in requests_}) == 1  # the same bytes every time
    for request in requests_:
        verify(request)  # each attempt signed afresh
    gaps = [b["at"] - a["at"] for a, b in zip(requests_, requests_[1:])]
    assert 0.15 <= gaps[0] and 0.3 <= gaps[1]  # backoff 0.3 s, then 0.6 s, each with jitter (>= half)
    delivery = wait_for_state(hooks, delivery_id)
    assert (delivery["state"], delivery["attempts"], delivery["last_status_code"]) == ("delivered", 3, 200)


def test_retry_after_is_honoured_across_countdown_hops(hooks, receiver):
    receiver.script((503, {"Retry-After": "4"}, 0))  # longer than one hop (half of 6 s)
    delivery_id = hooks.enqueue("subject-c", "job.completed", {}, receiver.url)
    first, second = receiver.wait_for(2, timeout=30)
    assert second["at"] - first["at"] >= 3.9  # not the 0.3 s backoff
    time.sleep(1)  # a second more in which nothing may come: the hops did not send anything twice
    assert len(receiver.requests) == 2
    delivery = wait_for_state(hooks, delivery_id)
    assert (delivery["state"], delivery["attempts"]) == ("delivered", 2)


def test_410_stops_for_good(hooks, receiver):
    receiver.script((410, {}, 0))
    delivery_id = hooks.enqueue("subject-d", "job.completed", {}, receiver.url)
    receiver.wait_for(1)
    delivery = wait_for_state(hooks, delivery_id)
    assert (delivery["state"], delivery["attempts"], delivery["last_status_code"]) == ("failed", 1, 410)
    time.sleep(2)  # a wait well past the backoff, in which nothing more may be sent
    assert len(receiver.requests) == 1


def test_a_redirect_is_a_failed_attempt_and_not_followed(hooks, receiver):
    receiver.script((307, {"Location": receiver.url + "/elsewhere"}, 0))
    delivery_id = hooks.enqueue("subject-r", "job.completed", {}, receiver.url)
    delivery = wait_for_state(hooks, delivery_id)
    assert (delivery["state"], delivery["attempts"]) == ("delivered", 2)
    assert [r["path"] for r in receiver.requests] == [receiver.hook_path] * 2


def test_a_timeout_is_a_failed_attempt(hooks, receiver):
    receiver.script((200, {}, 3.0))  # answers after the 1 s timeout
    delivery_id = hooks.enqueue("subject-e", "job.completed", {}, receiver.url)
    first, second = receiver.wait_for(2, timeout=30)
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"] == delivery_id
    delivery = wait_for_state(hooks, delivery_id)
    assert (delivery["state"], delivery["attempts"]) == ("delivered", 2)


def test_gives_up_at_the_retry_horizon_and_says_why(hooks, receiver):
    receiver.script(*[(500, {}, 0)] * 50)
    delivery_id = hooks.enqueue("subject-f", "job.completed", {}, receiver.url)
    delivery = wait_for_state(hooks, delivery_id, timeout=30)
    assert delivery["state"] == "failed" and delivery["last_status_code"] == 500
    assert "retry horizon" in delivery["last_error"]
    assert delivery["attempts"] == len(receiver.requests) >= 3
    # every attempt is scheduled within the 8 s horizon; the last may start a little past it when
    # its timer fires late on a loaded host (it is sent, not dropped for the worker's own delay)
    assert delivery["last_attempt_at"] <= delivery["created_at"] + 8.0 + 0.5


def test_a_private_address_is_refused_at_delivery(start_control_worker, receiver):
    """The URL passed the submit-time check elsewhere (or DNS changed since): the control worker
    checks the address it connects to and sends nothing."""
    settings = make_settings(webhook_allow_networks="")
    start_control_worker(settings)
    hooks = Webhooks(settings, redis.Redis.from_url(settings.redis_url, decode_responses=True))
    try:
        delivery_id = hooks.enqueue("subject-g", "job.completed", {}, receiver.url)
        delivery = wait_for_state(hooks, delivery_id)
        assert delivery["state"] == "failed" and delivery["attempts"] == 1
        assert "127.0.0.1" in delivery["last_error"] and delivery["last_status_code"] is None
        time.sleep(1)  # a second in which nothing may arrive
        assert receiver.requests == []
    finally:
        cleanup_namespace(settings)


def test_job_with_webhook_delivers_start_and_completed_with_the_text(live_api, control_worker, receiver):
    job = requests.post(f"{live_api}/v1/jobs", json={
        "prompt": "Say hello.", "max_tokens": 8, "temperature": 0, "cache": False,
        "webhook": receiver.url, "webhook_events": ["start", "completed"]}, timeout=30)
    assert job.status_code == 202, job.text
    job = job.json()
    # 'waiting' for its first event, or 'pending' when the idle worker started the job and queued
    # its start event before the API wrote this answer
    assert job["webhook"]["url"] == receiver.url and job["webhook"]["state"] in ("waiting", "pending")
    final = wait_for_job(live_api, job["id"])
    start, completed = receiver.wait_for(2)
    assert verify(start)["type"] == "job.start" and verify(start)["data"]["status"] == "running"
    payload = verify(completed)
    assert payload["type"] == "job.completed" and payload["data"]["id"] == job["id"]
    assert payload["data"]["status"] == "succeeded" and payload["data"]["text"] == final["text"] != ""
    assert payload["data"]["usage"] == final["usage"]
    def delivered():
        view = requests.get(f"{live_api}/v1/jobs/{job['id']}", timeout=10).json()["webhook"]
        return view["state"] == "delivered" and len(view["deliveries"]) == 2 and view
    view = wait_until(delivered, 10, interval=0.1)
    assert view["attempts"] == 1 and view["last_status_code"] == 200
    assert [d["type"] for d in view["deliveries"]] == ["job.start", "job.completed"]
    assert json.loads(completed["body"])["data"]["finish_reason"] in ("stop", "length")


def test_cancelling_a_queued_job_delivers_completed_with_status_cancelled(settings, hooks, receiver):
    """No model worker: the job waits in the queue; the API's cancel ends it and queues the event."""
    from api import create_app

    client = create_app(settings).test_client()
    job = client.post("/v1/jobs", json={"prompt": "never runs", "webhook": receiver.url}).json
    assert job["webhook"]["events"] == ["completed"]
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 200
    (request,) = receiver.wait_for(1)
    payload = verify(request)
    assert payload["type"] == "job.completed"
    assert (payload["data"]["id"], payload["data"]["status"]) == (job["id"], "cancelled")
    wait_until(lambda: client.get(f"/v1/jobs/{job['id']}").json["webhook"]["state"] == "delivered", 10,
               interval=0.05)


def test_identical_requests_each_get_their_own_completed_event(live_api, control_worker, receiver):
    """The second request rides on the first one's generation (coalescing) or, if that already
    ended, is answered from the cache: either way each job's webhook carries its own id and the
    same text."""
    body = {"prompt": "Name three colours.", "max_tokens": 24, "temperature": 0}
    ids = []
    for n in (1, 2):
        response = requests.post(f"{live_api}/v1/jobs", json={**body, "webhook": f"{receiver.url}?n={n}"},
                                 timeout=30)
        assert response.status_code in (200, 202), response.text
        ids.append(response.json()["id"])
    payloads = {r["path"]: verify(r) for r in receiver.wait_for(2, timeout=120)}
    assert {p["data"]["id"] for p in payloads.values()} == set(ids)
    assert payloads[f"{receiver.hook_path}?n=1"]["data"]["id"] == ids[0]
    texts = {p["data"]["text"] for p in payloads.values()}
    assert len(texts) == 1 and texts != {""}


def test_openai_request_names_a_webhook_through_extra_fields(live_api, control_worker, receiver):
    response = requests.post(f"{live_api}/v1/chat/completions", json={
        "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 8, "temperature": 0.7, "webhook": receiver.url}, timeout=120)
    assert response.status_code == 200, response.text
    (request,) = receiver.wait_for(1)
    data = verify(request)["data"]
    assert data["id"] == response.headers["X-LLMQ-Job-Id"]
    assert data["text"] == response.json()["choices"][0]["message"]["content"]
