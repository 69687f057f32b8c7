"""Throughput and latency of llmq vs one-job-at-a-time generation, on the same machine, in one run.

    python -m bench.bench [--levels 1,4,8,16] [--max-tokens 64] [--requests-per-client 2]
                          [--url http://127.0.0.1:8000] [--skip-baseline]

Side by side with other servers, all driven with the same OpenAI streaming chat load:

    python -m bench.bench --openai --engines hf,vllm --vllm-server --llama-server PATH \
        --levels 1,8,16 --max-tokens 128 --skip-baseline

(`--engines`: one llmq stack per engine; `--vllm-server`: vLLM's own OpenAI server on the same
model, so llmq-on-vLLM against it is the queue's cost; `--openvino-server`: the same for the
OpenVINO engine (its pipeline, built as llmq builds it, behind bench/harness/openvino_app.py);
`--openvino-engine`: that pipeline with no server at all, driven in process by the same closed-loop
load (bench/harness/engine_app.py), the ceiling of llmq on OpenVINO;
`--engine-variant NAME:VAR=VALUE`: one more such driver with settings changed, the ceiling of the
`--variant` of that NAME;
`--llama-server`: llama.cpp's server binary, built from source, on `--gguf`, by default the
embedded model's GGUF. All of them run at once and take turns, `--rounds` times, so the
machine's drift is shared rather than handed to the last.)

Starts its own llmq stack (worker + gunicorn API, fresh namespace) unless --url is given, then the
baseline (bench/harness/baseline_app.py: one Flask process, model.generate under a lock), and drives
both with the same closed-loop clients: each of N clients submits, streams the answer over SSE,
and submits again. Reports req/s, generated tokens/s, p50/p95 latency and time to first token,
and the llmq/baseline ratios. Loopback only; bounded by the request counts.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from bench.harness.clients import baseline_request, llmq_request, openai_request
from bench.harness.load import drive, drive_server, requests_per_client, turns
from bench.harness.measures import CoreUse, redis_server_pid, shares
from bench.harness.prompts import WORKLOADS
from bench.harness.results import args_dict, levels, parse_variant, save
from bench.harness.servers import (BaselineServer, LlamaServer, OpenVINOEngine, OpenVINOServer, PeerServer,
                                   Stack, VllmServer)
from bench.harness.stats import percentile, summarize
from common.models import EMBEDDED_GGUF, EMBEDDED_PACKAGE, resolve_model
from common.settings import Settings


def measure(name, server, request_fn, args) -> list[dict]:
    rows = []
    if server is not None:
        server.wait_ready()
    url = server.url if server is not None else args.url
    request_fn(url, "Say hi.", 4)  # warm-up
    for clients in args.levels:
        row = summarize(clients, *drive(request_fn, url, clients, args.requests_per_client, args.max_tokens))
        print(f"{name:9s} {json.dumps(row)}", flush=True)
        rows.append(row)
    if server is not None:
        server.stop()
    return rows


def print_table(ours: list[dict], base: list[dict], label: str = "base") -> None:
    head = f"{'clients':>7} | {'llmq tok/s':>10} {label + ' tok/s':>10} {'ratio':>6} | " \
           f"{'llmq p50/p95 lat':>16} {label + ' p50/p95 lat':>16} | {'llmq p50/p95 ttft':>17} " \
           f"{label + ' p50/p95 ttft':>17} | failed"
    print("\n" + head + "\n" + "-" * len(head))
    for o, b in zip(ours, base or [None] * len(ours)):
        ratio = f"{o['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b else "-"
        bt = f"{b['tokens_per_s']:10.1f}" if b else f"{'-':>10}"
        bl = f"{b['latency_p50']:7.2f}/{b['latency_p95']:<8.2f}" if b else f"{'-':>16}"
        bf = f"{b['ttft_p50']:8.3f}/{b['ttft_p95']:<8.3f}" if b else f"{'-':>17}"
        print(f"{o['clients']:>7} | {o['tokens_per_s']:10.1f} {bt} {ratio:>6} | "
              f"{o['latency_p50']:7.2f}/{o['latency_p95']:<8.2f} {bl} | "
              f"{o['ttft_p50']:8.3f}/{o['ttft_p95']:<8.3f} {bf} | {o['failed']}"
              + (f"/{b['failed']}" if b else ""))


def interleaved(servers: dict, args) -> dict[str, list[dict]]:
    """Each level, `args.rounds` rounds of every server in turn (bench/harness/load.py); pooled rows."""
    results: dict[str, list[dict]] = {name: [] for name in servers}
    core_use = {name: CoreUse(server_parts(server, args.redis_url)) for name, server in servers.items()}
    for clients in args.levels:
        pooled = {name: ([], 0.0) for name in servers}
        per_round = {name: [] for name in servers}
        cpu = {name: {} for name in servers}
        per_client = requests_per_client(clients, args.requests_per_client, args.min_requests)
        for round_, name in turns(list(servers), args.rounds):
            first = round_ * clients * per_client  # fresh prompts each round
            core_use[name].start()
            samples, wall = drive_server(servers[name], clients, per_client, args.max_tokens, first, args.workload)
            for part, seconds in core_use[name].stop().items():
                cpu[name][part] = cpu[name].get(part, 0.0) + seconds
            row = summarize(clients, samples, wall)
            print(f"{name:12s} round {round_ + 1} {json.dumps(row)}", flush=True)
            per_round[name].append(row["tokens_per_s"])
            pooled[name] = (pooled[name][0] + samples, pooled[name][1] + wall)
            # vLLM's compute process polls for about a second after its last request, on the
            # core the next server computes on: let it stop before the next turn starts
            time.sleep(args.settle_s)
        for name, (samples, wall) in pooled.items():
            results[name].append({**summarize(clients, samples, wall), "rounds": per_round[name],
                                  "cores": shares(cpu[name], wall, core_use[name].cores)})
    return results


def server_parts(server, redis_url: str) -> dict[str, tuple[int, str]]:
    """The processes a turn of `server` is charged (`CoreUse`): this process (the load's clients),
    each of the server's own with its children, and for an llmq stack its workers' own threads
    (Celery, the relays) apart from their engine processes, and the Redis it uses."""
    parts = {"clients": (os.getpid(), "self")}
    for name, proc in server.procs.items():
        if isinstance(server, Stack) and name.startswith("worker"):
            parts[name], parts[f"{name}-engine"] = (proc.pid, "self"), (proc.pid, "children")
        else:
            parts[name] = (proc.pid, "all")
    redis_pid = redis_server_pid(urlparse(redis_url).port or 6379) if isinstance(server, Stack) else None
    if redis_pid:
        parts["redis"] = (redis_pid, "all")
    return parts


def embedded_gguf() -> Path:
    return Path(importlib.util.find_spec(EMBEDDED_PACKAGE).submodule_search_locations[0]) / EMBEDDED_GGUF


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=levels, default=[1, 4, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--url", help="benchmark a running llmq instead of starting one")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--peer", action="store_true",
                        help="also drive llama-cpp-python's server on the embedded GGUF (pip install 'llama-cpp-python[server]')")
    parser.add_argument("--dtype", default="auto", help="llmq worker dtype")
    parser.add_argument("--baseline-dtype", default="float32",
                        help="baseline dtype: float32, what a plain model.generate server runs (and, "
                             "measured here, the faster one for generate(); bf16 generate() crawls)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--openai", action="store_true",
                        help="drive llmq through /v1/chat/completions streaming, like the other servers")
    parser.add_argument("--engines", default="hf",
                        help="llmq engines to run, one stack each: hf,vllm,openvino")
    parser.add_argument("--kv-cache-mb", type=int, default=1024, help="KV memory for llmq and vLLM's server")
    parser.add_argument("--eager", action="store_true", help="vLLM without its compile step (faster start)")
    parser.add_argument("--vllm-server", action="store_true", help="also vLLM's own OpenAI server")
    parser.add_argument("--openvino-server", action="store_true",
                        help="also OpenVINO GenAI's pipeline behind a minimal OpenAI server "
                             "(bench/harness/openvino_app.py), built with llmq-openvino's settings")
    parser.add_argument("--openvino-engine", action="store_true",
                        help="also the same pipeline driven in process by closed-loop clients, no server "
                             "(bench/harness/engine_app.py): the ceiling of llmq on OpenVINO")
    parser.add_argument("--engine-variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                        help="one more in-process OpenVINO driver (as --openvino-engine), named "
                             "openvino-engine-NAME, with these settings changed: the ceiling of the "
                             "--variant of the same NAME (e.g. bf16:LLMQ_WEIGHTS=bf16); repeatable")
    parser.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                        help="path of a built llama.cpp llama-server binary (or LLAMA_SERVER)")
    parser.add_argument("--gguf", help="GGUF for llama-server (default: the embedded model's)")
    parser.add_argument("--llama-lookup", action="store_true",
                        help="also llama-server with its own n-gram speculative decoding "
                             "(--spec-type ngram-simple): prompt lookup's peer on --workload grounded")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --openai: rounds of every server in turn, pooled per server")
    parser.add_argument("--settle-s", type=float, default=3.0,
                        help="with --openai: pause between turns, so one server's idle polling is over")
    parser.add_argument("--min-requests", type=int, default=8,
                        help="with --openai: at least this many requests per turn, however few the "
                             "clients (a single client's two requests are too few to measure)")
    parser.add_argument("--long-prompts", action="store_true",
                        help="with --openai: TTFT of unique ~1,500-token system prompts at 1 and 8 clients, "
                             "and 8 decoding streams' tokens/s beside them (bench/studies/long_prompts.py)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                        help="with --openai: one more llmq stack, named llmq-NAME, with these settings "
                             "changed (an A/B of a setting in one interleaved run); on vLLM unless they "
                             "set LLMQ_ENGINE; repeatable")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="stories",
                        help="with --openai: the prompts (bench/harness/prompts.py): distinct stories to "
                             "write, or input-grounded requests that quote, edit or summarise a given text "
                             "(where prompt lookup pays: --variant lookup:LLMQ_ENGINE=openvino,LLMQ_PROMPT_LOOKUP=true)")
    args = parser.parse_args()
    # a `timeout` (bench/gpu_check.sh) ends the run with SIGTERM: as an exception, so the `finally`
    # that stops every server runs (vLLM's own server is in a session of its own, out of reach of
    # a signal to the run's process group, and would keep its GPU memory)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.openai or args.engines != "hf":
        compare(args)
        return

    logs = args.out / "logs"
    stack = None if args.url else Stack(args.redis_url, args.model, logs, {"LLMQ_DTYPE": args.dtype})
    ours = measure("llmq", stack, llmq_request, args)
    base, peer = [], []
    if not args.skip_baseline:
        model_path = resolve_model(Settings(model=args.model, allow_download=False)).path
        base = measure("baseline", BaselineServer(str(model_path), logs, args.baseline_dtype), baseline_request, args)
    if args.peer:
        gguf = embedded_gguf()
        peer = measure("peer", PeerServer(str(gguf), logs, threads=os.cpu_count()), openai_request, args)
    print_table(ours, base)
    if peer:
        print("\nvs llama-cpp-python server (same GGUF, Q4_1):")
        print_table(ours, peer, "peer")
    save(args.out, "bench", {"args": args_dict(args), "llmq": ours, "baseline": base, "peer": peer})


def compare(args) -> None:
    """Every server under the same OpenAI streaming load; a table of tokens/s and p95 TTFT.

    All servers are started first (an idle one costs nothing: no step runs without requests), then
    driven in turns, `--rounds` times, each round's order the reverse of the last: these shared
    machines drift by several percent within minutes, and interleaving spreads the drift over
    every server instead of handing it to whichever ran last. Each server's figure pools its
    rounds (tokens over wall time; percentiles over all requests)."""
    logs = args.out / "logs"
    model_path = str(resolve_model(Settings(model=args.model, allow_download=False)).path)
    batch = max(args.levels)
    servers = {}
    try:
        def stack_env(engine: str) -> dict[str, str]:
            return {"LLMQ_DTYPE": args.dtype, "LLMQ_ENGINE": engine, "LLMQ_KV_CACHE_MB": str(args.kv_cache_mb),
                    "LLMQ_MAX_BATCH_SIZE": str(batch), "LLMQ_VLLM_ENFORCE_EAGER": str(args.eager)}

        for engine in filter(None, args.engines.split(",")):
            servers[f"llmq-{engine}"] = Stack(args.redis_url, args.model, logs / engine, stack_env(engine))
            servers[f"llmq-{engine}"].wait_ready(600)
        for name, changes in map(parse_variant, args.variant):
            env = {**stack_env("vllm"), **changes}
            servers[f"llmq-{name}"] = Stack(args.redis_url, args.model, logs / name, env)
            servers[f"llmq-{name}"].wait_ready(600)
        if args.vllm_server:
            servers["vllm-server"] = VllmServer(model_path, logs, args.dtype, args.kv_cache_mb, batch, args.eager)
        if args.openvino_server:
            servers["openvino-server"] = OpenVINOServer(args.model, logs / "openvino-server",
                                                        stack_env("openvino"))
        if args.openvino_engine:
            servers["openvino-engine"] = OpenVINOEngine(args.model, logs / "openvino-engine", stack_env("openvino"))
        for name, changes in map(parse_variant, args.engine_variant):
            servers[f"openvino-engine-{name}"] = OpenVINOEngine(args.model, logs / f"openvino-engine-{name}",
                                                                {**stack_env("openvino"), **changes})
        if args.llama_server:
            llama = functools.partial(LlamaServer, args.llama_server, args.gguf or str(embedded_gguf()), logs,
                                      threads=len(os.sched_getaffinity(0)), slots=batch)
            servers["llama-server"] = llama()
            if args.llama_lookup:
                servers["llama-lookup"] = llama(extra_args=("--spec-type", "ngram-simple"), name="llama-lookup")
        for server in servers.values():
            server.wait_ready()
            # warm-up at the largest batch: a server's first requests of a new shape are slow
            # (vLLM compiles for it), and that belongs to start-up, not to the first round
            drive_server(server, batch, 1, 16, first_prompt=10_000, workload=args.workload)
            time.sleep(args.settle_s)
        if args.long_prompts:
            from bench.studies import long_prompts

            long_results = long_prompts.run(servers, args)
        else:
            results = interleaved(servers, args)
    finally:
        for server in servers.values():
            server.stop()
    if args.long_prompts:
        long_prompts.print_table(long_results)
        write_compare(args, long_results)
        return
    print(f"\n{'server':15s} | " + " | ".join(f"{c:>3} clients tok/s (p95 TTFT)" for c in args.levels))
    for name, rows in results.items():
        print(f"{name:15s} | " + " | ".join(f"{r['tokens_per_s']:>12.1f} ({r['ttft_p95']:.2f} s){'':5s}"
                                             for r in rows))
    print(f"\n{'server':15s} | " + " | ".join(f"{c:>3} clients TTFT p50, ms/token" for c in args.levels))
    for name, rows in results.items():
        print(f"{name:15s} | " + " | ".join(f"{r['ttft_p50']:>12.3f} s, {r['tpot_ms'] or 0:5.1f}{'':4s}"
                                             for r in rows))
    print("\nwhere the cores went (shares of all cores over the turns: the load's clients, each process, the rest)")
    for name, rows in results.items():
        for r in rows:
            print(f"{name:15s} | {r['clients']:>3} clients | "
                  + " ".join(f"{part} {share:.2f}" for part, share in r["cores"].items()))
    for ours, theirs in compared_pairs([name for name, _ in map(parse_variant, args.variant)]):
        if ours in results and theirs in results:
            print(f"{ours} / {theirs}: " + ", ".join(
                f"{o['tokens_per_s'] / t['tokens_per_s']:.2f}x{round_ratios(o, t)} at {c}"
                for o, t, c in zip(results[ours], results[theirs], args.levels)))
    write_compare(args, results)


def compared_pairs(variants: list[str]) -> list[tuple[str, str]]:
    """The (ours, theirs) servers whose tokens/s the run sets side by side, where both ran: llmq
    against each peer and its engine's ceiling, and each `--variant` NAME against the stacks,
    the peers and its own ceiling, `--engine-variant` NAME."""
    pairs = [("llmq-vllm", "vllm-server"), ("llmq-vllm", "llama-server"), ("llmq-hf", "llama-server"),
             ("llmq-openvino", "openvino-server"), ("llmq-openvino", "openvino-engine"),
             ("openvino-server", "openvino-engine"), ("llmq-openvino", "vllm-server"),
             ("llmq-openvino", "llama-server")]
    return pairs + [(f"llmq-{name}", base) for name in variants
                    for base in ("llmq-vllm", "llmq-openvino", "vllm-server", "llama-server", "llama-lookup",
                                 f"openvino-engine-{name}")]


def round_ratios(ours: dict, theirs: dict) -> str:
    """The ratio of two servers' tokens/s within each round, as " (rounds 0.91-1.02, median 0.97)"
    (the median from three rounds up). Each round's two turns ran minutes apart at most, so on a
    host whose speed drifts from round to round these say more than the ratio of the pooled
    figures does; empty for a single round."""
    ratios = sorted(o / t for o, t in zip(ours.get("rounds", []), theirs.get("rounds", [])) if t)
    if len(ratios) < 2:
        return ""
    median = f", median {percentile(ratios, 50):.2f}" if len(ratios) > 2 else ""
    return f" (rounds {ratios[0]:.2f}-{ratios[-1]:.2f}{median})"


def write_compare(args, results: dict[str, list[dict]]) -> Path:
    """`compare-<local time>.json` in `args.out`: the arguments (as text) and each server's rows
    (one `summarize` dict per level); bench/gpu_report.py reads it."""
    return save(args.out, "compare", {"args": args_dict(args), "results": results})


if __name__ == "__main__":
    main()
