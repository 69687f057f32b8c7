"""The front door under load: streams that cost no thread while they wait, waiting clients that
hear their place in line, and limits on open streams that answer at once.

The API runs here as it is deployed: gunicorn with gevent workers (`ops/gunicorn.conf.py`), one
process, in a subprocess; the bounds and the places are also checked on the in-process server.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid

import aiohttp
import pytest
import redis
import requests

from api import create_app
from common.api_keys import hash_key
from common.keys import Keys
from common.sseclient import aiter_sse, iter_sse
from common.stores import Stores
from tests.support.api_process import ApiProcess
from tests.support.servers import LiveServer
from tests.support.settings import cleanup_namespace, make_settings
from tests.support.waiting import wait_until


# --- helpers ----------------------------------------------------------------------------------
async def read_stream(session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float,
                      opened: list | None = None) -> dict:
    """One streamed job, read to its `done`: when its headers came, its `queued` places, its end.
    Once its headers have come, the stream is counted in `opened`."""
    sent = time.monotonic()
    seen = {"headers_s": None, "places": [], "done": None, "status": None}

    async def read():
        async with session.post(url, json=body) as resp:
            seen["headers_s"], seen["status"] = time.monotonic() - sent, resp.status
            if opened is not None:
                opened.append(url)
            async for event in aiter_sse(resp.content):
                if event.event == "queued":
                    seen["places"].append(event.json()["queue_position"])
                elif event.event == "done":
                    seen["done"] = event.json()
                    return
    await asyncio.wait_for(read(), timeout_s)
    return seen


# --- fixtures ---------------------------------------------------------------------------------
KEY_A, KEY_B = "llmq-test-key-a", "llmq-test-key-b"


@pytest.fixture
def bounded_api(model_ref):
    """An in-process API that allows 3 open streams, 1 of them key a's; no worker, so every job
    waits in the queue."""
    settings = make_settings(max_streams_per_process=3, api_keys=f"a:{hash_key(KEY_A)}:streams=1,"
                                                                 f"b:{hash_key(KEY_B)}")
    server = LiveServer(create_app(settings))
    yield server.url, settings
    server.stop()
    cleanup_namespace(settings)


@pytest.fixture
def waiting_api(model_ref):
    """An in-process API without a worker, that places waiting streams every 0.2 s."""
    settings = make_settings(queue_place_interval_s=0.2, queue_place_every_s=1.0)
    server = LiveServer(create_app(settings))
    yield server.url, settings
    server.stop()
    cleanup_namespace(settings)


def open_stream(url: str, key: str, path: str = "/v1/jobs", **body) -> requests.Response:
    body = body or {"prompt": f"hold {uuid.uuid4().hex}", "max_tokens": 4, "stream": True}
    return requests.post(f"{url}{path}", json=body, stream=True, timeout=10,
                         headers={"Authorization": f"Bearer {key}"})


def queue_depth(settings) -> int:
    return redis.Redis.from_url(settings.redis_url).zcard(Keys(settings.namespace).queued)


# --- limits -----------------------------------------------------------------------------------
def test_stream_limits_answer_at_once_with_retry_after_and_queue_nothing(bounded_api):
    url, settings = bounded_api
    first = open_stream(url, KEY_A)
    assert first.status_code == 200
    over_key = open_stream(url, KEY_A)
    assert over_key.status_code == 429 and int(over_key.headers["Retry-After"]) > 0
    assert over_key.json()["error"]["type"] == "too_many_streams"
    streams = [open_stream(url, KEY_B), open_stream(url, KEY_B)]
    assert [s.status_code for s in streams] == [200, 200]
    assert queue_depth(settings) == 3  # the refused request queued nothing

    # the process holds its 3: every kind of stream is refused with 503, nothing is queued
    over = [open_stream(url, KEY_B),
            requests.get(f"{url}/v1/jobs/{first.headers['X-Job-Id']}/events", stream=True, timeout=10,
                         headers={"Authorization": f"Bearer {KEY_A}"}),
            open_stream(url, KEY_B, "/v1/chat/completions", model="SmolLM2-135M-Instruct",
                        messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert [r.status_code for r in over] == [503, 503, 503]
    assert all(int(r.headers["Retry-After"]) > 0 for r in over)
    assert over[2].json()["error"]["code"] == "too_many_streams"  # OpenAI's error shape there
    assert queue_depth(settings) == 3
    assert "llmq_api_open_streams 3.0" in requests.get(f"{url}/metrics", timeout=10).text

    # a stream that closes gives its slot back (noticed at its next heartbeat)
    first.close()
    def key_a_may_open_again():
        again = open_stream(url, KEY_A)
        again.close()
        return again.status_code == 200
    wait_until(key_a_may_open_again, timeout=10)
    for s in streams:
        s.close()


# --- places -----------------------------------------------------------------------------------
def test_a_waiting_stream_hears_its_place_as_jobs_ahead_leave(waiting_api):
    """No worker: the queue moves only as jobs ahead are cancelled; the stream's `queued` events
    follow it down, and the OpenAI stream carries the same places as comments."""
    url, settings = waiting_api
    ahead = [requests.post(f"{url}/v1/jobs", json={"prompt": f"ahead {i}", "max_tokens": 4},
                           timeout=10).json()["id"] for i in range(3)]
    with requests.post(f"{url}/v1/jobs", json={"prompt": "mine", "max_tokens": 4, "stream": True},
                       stream=True, timeout=10) as resp:
        places = []
        for event in iter_sse(resp.iter_lines()):
            if event.event == "queued":
                place = event.json()["queue_position"]
                if place not in places and ahead:  # at each new place, one leaves
                    requests.delete(f"{url}/v1/jobs/{ahead.pop()}", timeout=10)
                places.append(place)
                if place == 1:
                    break
        assert places[0] == 4 and places[-1] == 1
        assert places == sorted(places, reverse=True) and len(set(places)) == 4

    openai = requests.post(f"{url}/v1/chat/completions", stream=True, timeout=10, json={
        "model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    for event in iter_sse(openai.iter_lines(), comments=True):
        if event.event == ":" and event.data.startswith("queued "):
            assert json.loads(event.data.removeprefix("queued "))["queue_position"] == 2  # behind "mine", still queued
            break
    openai.close()


# --- under load, on gevent --------------------------------------------------------------------
@pytest.fixture(scope="module")
def gevent_stack(start_worker, tmp_path_factory):
    settings = make_settings(max_batch_size=32, max_queue=5000, queue_place_interval_s=0.5,
                             log_level="WARNING")
    start_worker(settings)
    api = ApiProcess(settings, tmp_path_factory.mktemp("logs") / "gevent-api.log", gunicorn=True)
    yield api, settings
    api.stop()
    cleanup_namespace(settings)


@pytest.mark.slow
def test_500_streams_on_one_process_all_get_headers_promptly_and_complete(gevent_stack):
    api, _ = gevent_stack
    clients = 500
    threads, opened = [], []

    async def run():
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def one(i):
                return await read_stream(session, f"{api.url}/v1/jobs", {
                    "prompt": f"Say hi to number {i} ({uuid.uuid4().hex[:6]}).", "max_tokens": 2,
                    "stream": True}, timeout_s=240, opened=opened)

            async def count_threads():  # once every stream is open (most still wait for a slot)
                clock = asyncio.get_running_loop().time
                deadline = clock() + 60
                while len(opened) < clients and clock() < deadline:
                    await asyncio.sleep(0.05)
                threads.append(api.serving_process().num_threads())
            results = await asyncio.gather(*(one(i) for i in range(clients)), count_threads())
            return results[:-1]

    results = asyncio.run(run())
    assert [r["status"] for r in results] == [200] * clients
    # every stream's first bytes came at once, though most jobs waited seconds for a slot
    assert max(r["headers_s"] for r in results) < 10
    assert all(r["done"] and r["done"]["status"] == "succeeded" for r in results)
    assert sum(bool(r["places"]) for r in results) > clients / 2  # most waited, and heard where
    assert threads[0] < 40  # 500 open streams, a handful of threads: a stream costs no thread


@pytest.mark.slow
def test_a_slow_reader_does_not_stall_other_streams(gevent_stack):
    """One client asks for a job's log of 8 MB and reads nothing (its socket buffers fill and the
    server's write to it blocks); meanwhile other streams on the same process complete, and the
    stalled one is intact when its client reads at last."""
    api, settings = gevent_stack
    store = Stores(settings.model_copy(update={"events_maxlen": 100_000})).jobs
    big = uuid.uuid4().hex
    store.create_finished(big, {"id": big, "status": "succeeded", "model": "m", "created_at": time.time(),
                                "finished_at": time.time(), "finish_reason": "length"})
    pipe = store.r.pipeline(transaction=False)
    for i in range(8000):
        pipe.xadd(store.keys.events(big), {"event": "chunk", "data": json.dumps({"index": i, "text": "x" * 1000})})
    pipe.execute()
    store.token_log.publish_done(big)

    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", int(api.url.rsplit(":", 1)[1])))
    slow.sendall(f"GET /v1/jobs/{big}/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    slow.settimeout(30)
    slow.recv(1, socket.MSG_PEEK)  # the answer has begun: 8 MB cannot fit the socket buffers, its write blocks

    async def others():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            return await asyncio.gather(*(read_stream(session, f"{api.url}/v1/jobs", {
                "prompt": f"Name a colour ({i}, {uuid.uuid4().hex[:6]}).", "max_tokens": 4, "stream": True},
                timeout_s=60) for i in range(20)))
    assert all(r["done"]["status"] == "succeeded" for r in asyncio.run(others()))

    received = b""
    slow.settimeout(30)
    while chunk := slow.recv(1 << 20):
        received += chunk
    slow.close()
    assert received.count(b"event: chunk") == 8000 and b"event: done" in received
