"""The soak's Responses mode (`bench/soak.py --responses`): background responses through the
official `openai` package, under the same load and chaos as the jobs soak.

Each client loops: create a background response (stream=True), some with a tool forced by
`tool_choice` so function-call items stream, the rest plain; then follow its stream to the end, or
drop it after a few events and resume with `retrieve(stream=True, starting_after=last)` on the
next API process (the same one where the stack has one), or cancel it part way and read its stream
to the end, or create it without a stream and poll `retrieve` until it ends. A stream that breaks
(a worker kill, a Redis failover, a dropped connection) is resumed the same way.

Checked per stream: its events, joined across resumes, are numbered 0, 1, 2... without a gap or a
repeat; none is an `error` event; its text deltas are the stored `output_text` and its arguments
deltas the stored function_call items' `arguments`. At the end every response is read back:
submitted = completed + incomplete + cancelled + failed (each with its reason), none lost.
"""
from __future__ import annotations

import random
import time
from collections import Counter

import httpx
import openai
import requests

from bench.harness.clients import served_model
from bench.harness.soak_clients import SoakClients

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
ENDED = {"completed", "incomplete", "cancelled", "failed"}
CITY = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
        "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "parameters": CITY}
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Kyoto", "Quito", "Accra", "Perth"]
BROKEN = (openai.APIConnectionError, httpx.HTTPError)


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


class Followed:
    """One response's stream as its client assembled it, across resumes."""

    def __init__(self, response_id: str):
        self.id = response_id
        self.events: list = []
        self.errors: list[str] = []
        self.resumes = 0

    @property
    def last(self) -> int | None:
        return self.events[-1].sequence_number if self.events else None

    @property
    def ended(self) -> bool:
        return bool(self.events) and self.events[-1].type in TERMINAL

    def read(self, stream, stop_after: int | None = None) -> None:
        """Events until the terminal one, `stop_after` events, an error event or a break."""
        seen = 0
        try:
            for event in stream:
                if event.type == "error":
                    self.errors.append(getattr(event, "message", None) or str(event))
                    return
                self.events.append(event)
                seen += 1
                if event.type in TERMINAL or (stop_after and seen >= stop_after):
                    return
        except BROKEN:
            return
        finally:
            stream.close()

    def text(self) -> str:
        return "".join(e.delta for e in self.events if e.type == "response.output_text.delta")

    def arguments(self) -> dict[str, str]:
        joined: dict[str, str] = {}
        for e in self.events:
            if e.type == "response.function_call_arguments.delta":
                joined[e.item_id] = joined.get(e.item_id, "") + e.delta
        return joined


class ResponsesSoak(SoakClients):
    def __init__(self, urls: list[str], args):
        super().__init__(args)
        self.urls = urls
        self.clients = [client_of(url) for url in urls]
        self.model = served_model(urls[0])
        self.counts.update(streams_with_error_event=0, streams_with_gap_or_repeat=0)
        self.submitted: dict[str, str] = {}  # response id -> the client's action
        self.bad_streams: list[dict] = []

    # --- one client --------------------------------------------------------------------------
    def client(self, n: int) -> None:
        rng = random.Random(self.args.seed * 1000 + n)
        while time.monotonic() < self.stop_at:
            if len(self.submitted) >= self.args.max_jobs:
                return
            try:
                self.one_response(rng, n)
            except openai.APIStatusError as exc:
                self.refused(exc)
            except (*BROKEN, requests.RequestException) as exc:
                self.count("client_errors")
                self.note(f"client {n}: {type(exc).__name__}: {exc}")
                time.sleep(1)

    def one_response(self, rng: random.Random, n: int) -> None:
        api = n % len(self.clients)
        tools = rng.random() < self.args.tool_rate
        city = rng.choice(CITIES)
        body = dict(model=self.model, background=True, temperature=0.8,
                    max_output_tokens=rng.randint(16, self.args.max_tokens), extra_body={"cache": False},
                    input=f"What is the weather in {city}?" if tools else f"Write two sentences about {city}.")
        if tools:
            body.update(tools=[WEATHER], tool_choice=rng.choice(
                [{"type": "function", "name": "get_weather"}, "required"]))
        action = rng.choices(["stream", "resume", "cancel", "poll"],
                             [1 - self.args.cancel_rate - self.args.disconnect_rate - 0.1,
                              self.args.disconnect_rate, self.args.cancel_rate, 0.1])[0]
        self.count(f"action_{action}{'_tools' if tools else ''}")
        if action == "poll":
            created = self.clients[api].responses.create(**body)
            self.submit(created.id, action)
            self.check(Followed(created.id), self.wait_ended(created.id))
            return
        stream = self.clients[api].responses.create(stream=True, **body)
        followed = Followed("resp_" + stream.response.headers["x-llmq-job-id"])
        self.submit(followed.id, action)
        if action == "stream":
            followed.read(stream)
        else:
            followed.read(stream, stop_after=rng.randint(3, 12))
            if action == "cancel":
                time.sleep(rng.uniform(0, 1))
                self.cancel(followed.id)
        self.follow_to_end(followed, api)
        self.check(followed, self.wait_ended(followed.id))

    def follow_to_end(self, followed: Followed, api: int) -> None:
        """Resume on the next API process, from the last event seen, until the terminal event."""
        deadline = time.monotonic() + self.args.drain
        while not followed.ended and not followed.errors and time.monotonic() < deadline:
            api = (api + 1) % len(self.clients)
            after = {} if followed.last is None else {"starting_after": followed.last}
            followed.resumes += 1
            try:
                followed.read(self.clients[api].responses.retrieve(followed.id, stream=True, **after))
            except openai.APIStatusError as exc:
                self.refused(exc)
            except BROKEN:
                time.sleep(0.5)

    def cancel(self, response_id: str) -> None:
        for _ in range(20):
            try:
                self.clients[0].responses.cancel(response_id)
                self.count("cancels_accepted")
                return
            except openai.APIStatusError as exc:
                if exc.status_code == 409:  # it ended first
                    self.count("cancels_too_late")
                    return
                self.refused(exc)
            except BROKEN:
                time.sleep(0.5)

    def wait_ended(self, response_id: str, deadline: float | None = None):
        """The stored response once it has ended (or as it is at the deadline: the drain's end)."""
        deadline = deadline or time.monotonic() + self.args.drain
        while True:
            response = self.retrieve(response_id)
            if response is None or response.status in ENDED or time.monotonic() > deadline:
                return response
            time.sleep(0.25)

    def retrieve(self, response_id: str):
        for _ in range(240):
            try:
                return self.clients[0].responses.retrieve(response_id)
            except openai.NotFoundError:
                return None
            except openai.APIStatusError as exc:
                self.refused(exc)
            except BROKEN:
                time.sleep(0.5)
        return None

    # --- checks ------------------------------------------------------------------------------
    def check(self, followed: Followed, stored) -> None:
        if followed.resumes:
            self.count("streams_resumed")
        if not followed.events and not followed.errors:
            return  # polled: nothing streamed
        numbers = [e.sequence_number for e in followed.events]
        problems = []
        if followed.errors:
            self.count("streams_with_error_event")
            problems.append(f"error event: {followed.errors[0]}")
        if numbers != list(range(len(numbers))):
            self.count("streams_with_gap_or_repeat")
            problems.append(f"numbering {numbers[:3]}..{numbers[-3:]} is not 0..{len(numbers) - 1}")
        if not followed.ended:
            problems.append("no terminal event")
        elif stored is not None:
            calls = {i.id: i.arguments for i in stored.output if i.type == "function_call"}
            if followed.text() != stored.output_text:
                problems.append("deltas differ from the stored output_text")
            if followed.arguments() != {k: v for k, v in calls.items() if v}:
                problems.append("arguments deltas differ from the stored function_call items")
            if calls:
                self.count("streams_with_tool_calls")
        self.count("streams_bad" if problems else "streams_ok")
        if problems:
            with self.lock:
                self.bad_streams.append({"id": followed.id, "problems": problems, "resumes": followed.resumes})

    # --- bookkeeping -------------------------------------------------------------------------
    def submit(self, response_id: str, action: str) -> None:
        with self.lock:
            self.submitted[response_id] = action
            self.counts["submitted"] += 1

    def refused(self, exc: openai.APIStatusError) -> None:
        self.count(f"refused_{exc.status_code}")
        retry = exc.response.headers.get("Retry-After", "1") if exc.response is not None else "1"
        time.sleep(min(float(retry), 5))

    def reconcile(self) -> dict:
        """Every submitted response read back: ended, and a failed one with its reason."""
        outcome: Counter[str] = Counter()
        failures, lost = [], []
        deadline = time.monotonic() + 60  # the clients waited their drain already
        for response_id in list(self.submitted):
            response = self.wait_ended(response_id, deadline)
            status = response.status if response is not None else "missing"
            outcome[status if status in ENDED else "lost"] += 1
            if status == "failed":
                failures.append({"id": response_id, "status": status,
                                 "error": response.error.message if response.error else None})
            elif status not in ENDED:
                lost.append({"id": response_id, "status": status})
        return {"submitted": len(self.submitted), "succeeded": outcome["completed"] + outcome["incomplete"],
                "completed": outcome["completed"], "incomplete": outcome["incomplete"],
                "cancelled": outcome["cancelled"], "failed": outcome["failed"], "lost": outcome["lost"],
                "failures": failures, "lost_jobs": lost[:10], "answers_bad": len(self.bad_streams),
                "bad_answers": self.bad_streams[:5], "client_counts": dict(sorted(self.counts.items()))}
