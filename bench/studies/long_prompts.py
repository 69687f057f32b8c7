"""Long prompts against each server: time to first token when every request brings a system
prompt of its own of about 1,500 tokens (no prefix cache can help), and what such prompts cost the
streams already decoding. `python -m bench.bench --openai ... --long-prompts` runs it on the
servers bench.bench started, in place of the usual levels.

- TTFT: 1 and 8 closed-loop clients, each request a unique long system prompt, max_tokens 8;
  p50 and max. In a closed loop, which requests wait behind which depends on how fast each
  server decodes the short answers (a client that is still reading sends its next prompt later),
  so the 8-client p50 moves a lot from run to run.
- TTFT of bursts: 8 such requests sent at once, `BURST_ROUNDS` times, each burst after the last
  has ended: how soon a server answers prompts that arrive together, with no loop in between.
- Decode beside prefills: 8 streams of short prompts decode `--max-tokens` tokens each, once
  alone and once while 2 clients keep sending long prompts; the 8 streams' tokens/s in each case.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bench.harness.clients import Sample, openai_request
from bench.harness.prompts import long_system_prompt, story
from bench.harness.results import markdown_table
from bench.harness.stats import percentile

BURST_ROUNDS = 3


def ttft_with_long_prompts(url: str, clients: int, per_client: int, first_seed: int) -> list[Sample]:
    def client(index: int) -> list[Sample]:
        seeds = range(first_seed + index * per_client, first_seed + (index + 1) * per_client)
        return [openai_request(url, "Name one word from the reference.", 8, system=long_system_prompt(seed))
                for seed in seeds]
    with ThreadPoolExecutor(clients) as pool:
        return [s for batch in pool.map(client, range(clients)) for s in batch]


def ttft_in_bursts(url: str, size: int, rounds: int, first_seed: int) -> list[Sample]:
    """`rounds` bursts of `size` long-prompt requests sent at once, each after the last ended."""
    samples = []
    with ThreadPoolExecutor(size) as pool:
        for round_ in range(rounds):
            seeds = range(first_seed + round_ * size, first_seed + (round_ + 1) * size)
            samples += pool.map(lambda seed: openai_request(url, "Name one word from the reference.", 8,
                                                            system=long_system_prompt(seed)), seeds)
    return samples


def ttft_summary(samples: list[Sample]) -> dict:
    ttfts = [s.ttft for s in samples if s.ok]
    return {"p50": round(percentile(ttfts, 50), 3), "max": round(max(ttfts), 3), "failed": len(samples) - len(ttfts),
            "each": sorted(round(t, 2) for t in ttfts)}


def decode_tokens_per_s(url: str, streams: int, max_tokens: int, first_seed: int,
                        long_prompt_clients: int = 0) -> float:
    """Tokens/s of `streams` decoding streams, with `long_prompt_clients` sending long prompts
    (max_tokens 8) all the while."""
    stop = threading.Event()

    def interfere(index: int) -> None:
        seed = first_seed + 10_000 + index * 1000
        while not stop.is_set():
            openai_request(url, "Name one word from the reference.", 8, system=long_system_prompt(seed))
            seed += 1

    interferers = [threading.Thread(target=interfere, args=(i,), daemon=True) for i in range(long_prompt_clients)]
    for thread in interferers:
        thread.start()
    if interferers:
        time.sleep(1.0)  # the long prompts are arriving when the streams start
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        samples = list(pool.map(lambda i: openai_request(
            url, story(first_seed + i), max_tokens), range(streams)))
    wall = time.perf_counter() - start
    stop.set()
    for thread in interferers:
        thread.join()
    return sum(s.tokens for s in samples if s.ok) / wall


def run(servers: dict, args) -> dict[str, dict]:
    """Each measurement on every server in turn, before the next measurement (drift spreads)."""
    results: dict[str, dict] = {name: {} for name in servers}
    for clients in (1, 8):
        for name, server in servers.items():
            samples = ttft_with_long_prompts(server.url, clients, max(2, 32 // clients), first_seed=clients * 100)
            results[name][f"ttft_{clients}"] = ttft_summary(samples)
            print(name, clients, results[name][f"ttft_{clients}"], flush=True)
            time.sleep(args.settle_s)
    for name, server in servers.items():
        results[name]["burst_8"] = ttft_summary(ttft_in_bursts(server.url, 8, BURST_ROUNDS, first_seed=3000))
        print(name, "bursts of 8", results[name]["burst_8"], flush=True)
        time.sleep(args.settle_s)
    for name, server in servers.items():
        alone = decode_tokens_per_s(server.url, 8, args.max_tokens, first_seed=5000)
        time.sleep(args.settle_s)
        beside = decode_tokens_per_s(server.url, 8, args.max_tokens, first_seed=6000, long_prompt_clients=2)
        results[name]["decode"] = {"alone": round(alone, 1), "beside_long_prompts": round(beside, 1)}
        print(name, results[name]["decode"], flush=True)
        time.sleep(args.settle_s)
    return results


def print_table(results: dict[str, dict]) -> None:
    rows = []
    for name, r in results.items():
        one, eight, burst, decode = r["ttft_1"], r["ttft_8"], r["burst_8"], r["decode"]
        rows.append([name, *(f"{t['p50']:.2f} / {t['max']:.2f} s" for t in (one, eight, burst)),
                     f"{decode['alone']:.1f}", f"{decode['beside_long_prompts']:.1f}"])
    print("\n" + markdown_table(["server", "TTFT p50 / max, 1 client", "8 clients", f"bursts of 8 (x{BURST_ROUNDS})",
                                 "8 streams decoding, tok/s alone", "beside long prompts"], rows))
