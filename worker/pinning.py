"""CPU sets for workers: parse them, and split a machine's CPUs among K pinned workers.

`python -m worker.pinning K` prints K CPU specs, one a line (used by `ops/workers.sh`): each worker
gets its own contiguous share of the CPUs this process may use, so two workers never compete for a
core and each sizes its torch thread pool to its share.
"""
from __future__ import annotations

import os
import sys


def parse_cpus(spec: str) -> set[int]:
    """'0-1,4' -> {0, 1, 4}"""
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def format_cpus(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'"""
    parts, ordered = [], sorted(cpus)
    start = prev = ordered[0]
    for cpu in ordered[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


def split_cpus(available: set[int] | list[int], workers: int) -> list[str]:
    """`workers` disjoint CPU specs covering `available`, as even as possible."""
    cpus = sorted(available)
    if not 1 <= workers <= len(cpus):
        raise ValueError(f"cannot give {workers} workers a core each out of {len(cpus)} CPUs")
    base, extra = divmod(len(cpus), workers)
    specs, start = [], 0
    for i in range(workers):
        size = base + (i < extra)
        specs.append(format_cpus(cpus[start:start + size]))
        start += size
    return specs


if __name__ == "__main__":
    print("\n".join(split_cpus(os.sched_getaffinity(0), int(sys.argv[1]))))
