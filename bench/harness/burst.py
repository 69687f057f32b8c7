"""Thousands of streaming chat clients at once from one asyncio client (aiohttp, a connection
each): what each one saw, from sending its request to its last line (bench/front_door.py)."""
from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass

import aiohttp

LATE_PLACE_S = 2.0  # a waiting client should hear its place within this of its headers
FDS_PER_CLIENT = 2


@dataclass
class Client:
    """What one streaming client saw; times are seconds from sending its request."""
    index: int
    headers_s: float | None = None
    first_place_s: float | None = None
    places: int = 0  # `: queued` comments heard (each one is a write the server made)
    first_token_s: float | None = None  # the first data line after the role chunk
    ended_s: float | None = None  # when it stopped reading, whatever the reason
    status: int | None = None
    job_id: str | None = None
    queued_at_headers: bool | None = None  # its job was in the queue when its headers came
    completed: bool = False
    cut: bool = False
    error: str | None = None
    completion_tokens: int = 0

    @property
    def answered(self) -> bool:
        """It has its headers or an error: the server has dealt with its arrival."""
        return self.headers_s is not None or self.error is not None

    @property
    def open(self) -> bool:
        return self.status == 200 and self.ended_s is None

    @property
    def waited(self) -> bool:
        return bool(self.queued_at_headers) or self.first_place_s is not None

    @property
    def heard_place_late(self) -> bool:
        """It waited, and 2 s after its headers it had heard neither its place nor a token,
        though it was still reading."""
        if not self.waited or self.headers_s is None:
            return False
        limit = self.headers_s + LATE_PLACE_S
        told = [t for t in (self.first_place_s, self.first_token_s) if t is not None]
        return not (told and min(told) <= limit) and (self.ended_s is None or self.ended_s > limit)


def chat_body(model: str, prompt: str, max_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}}


async def read_stream(resp: aiohttp.ClientResponse, client: Client, t0: float) -> None:
    """Read the SSE lines until `[DONE]`, noting the first place, the first token and the usage."""
    data_lines = 0
    async for raw in resp.content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line.startswith(": queued"):
            client.places += 1
            if client.first_place_s is None:
                client.first_place_s = time.monotonic() - t0
        elif line.startswith("data:"):
            payload = line[5:].strip()
            if payload == "[DONE]":
                client.completed = True
                return
            data_lines += 1
            if data_lines == 2:
                client.first_token_s = time.monotonic() - t0
            body = json.loads(payload)
            if body.get("error"):
                client.error = f"stream error {body['error'].get('type') or body['error'].get('code')}"
            if body.get("usage"):
                client.completion_tokens = body["usage"]["completion_tokens"]


async def stream_chat(session: aiohttp.ClientSession, url: str, body: dict, client: Client,
                      deadline: float, on_headers=None) -> None:
    """One streaming chat, read until `[DONE]` or `deadline` (loop time), then closed: a client
    that leaves before the end has its job cancelled by the server."""
    t0 = time.monotonic()
    hold = asyncio.timeout_at(deadline)
    try:
        async with hold:
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                client.headers_s, client.status = time.monotonic() - t0, resp.status
                if resp.status != 200:
                    client.error = f"status {resp.status}"
                    return
                client.job_id = resp.headers.get("X-LLMQ-Job-Id")
                if on_headers:
                    on_headers(client)
                await read_stream(resp, client, t0)
                if not client.completed and client.error is None:
                    client.error = "ended without [DONE]"
    except TimeoutError:
        if not hold.expired():  # aiohttp's own timeouts are TimeoutErrors too
            client.error = "client timeout"
        elif client.headers_s is None:
            client.error = "no headers"
        else:
            client.cut = True
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        client.error = type(exc).__name__
    finally:
        client.ended_s = time.monotonic() - t0


def client_session() -> aiohttp.ClientSession:
    """One connection per client, none reused, no client-side cap on connections; deadlines
    come from each client's hold, not from aiohttp."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None))


def raise_open_files(largest_level: int) -> dict:
    """The client holds a socket per client: raise its soft open-file limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    needed = FDS_PER_CLIENT * largest_level + 100
    enough = hard == resource.RLIM_INFINITY or hard >= needed
    if not enough:
        print(f"WARNING: the open-file hard limit {hard} is below the {needed} the largest level "
              f"({largest_level} clients) needs: clients past it will fail (raise it: ulimit -Hn)")
    return {"soft_before": soft, "hard": hard, "needed": needed, "enough": enough}
