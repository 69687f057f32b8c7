"""Percentiles and a level's summary row: one definition for every benchmark, so figures from two
benchmarks mean the same thing."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from bench.harness.clients import Sample


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (the smallest value with at least q% of the values at or below
    it: p100 is the max, p50 of an even count the lower middle); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize(clients: int, samples: list[Sample], wall: float) -> dict:
    """One level's row: requests, failures, req/s, tokens/s over the wall time, p50/p95 latency
    and time to first token, and the time per output token after the first (decode speed alone,
    apart from the queue's wait)."""
    good = [s for s in samples if s.ok]
    per_token = [(s.latency - s.ttft) / (s.tokens - 1) for s in good if s.tokens > 1]
    latency, ttft = [s.latency for s in good], [s.ttft for s in good]
    return {
        "clients": clients, "requests": len(samples), "failed": len(samples) - len(good),
        "wall_s": round(wall, 2), "req_per_s": round(len(good) / wall, 3),
        "tokens_per_s": round(sum(s.tokens for s in good) / wall, 1),
        "latency_p50": rounded(percentile(latency, 50), 2),
        "latency_p95": rounded(percentile(latency, 95), 2),
        "ttft_p50": rounded(percentile(ttft, 50)),
        "ttft_p95": rounded(percentile(ttft, 95)),
        "tpot_ms": round(1000 * statistics.fmean(per_token), 2) if per_token else None,
    }
