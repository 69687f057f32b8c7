"""CPU sets for workers: parse them, split a machine's CPUs among K pinned workers, and split a
vLLM worker's set into service and compute cores.

`python -m worker.pinning K` prints K CPU specs, one a line (used by `ops/workers.sh`): each worker
gets its own contiguous share of the CPUs this process may use, so two workers never compete for a
core and each sizes its torch thread pool to its share. `python -m worker.pinning --service`
prints the service cores of this process's CPUs, and `--relay-nice` the niceness for what runs
there beside vLLM's engine core (both used by `ops/run.sh` to start the API beside a vLLM worker).
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


def service_and_compute(cpus: set[int] | list[int], reserved: int) -> tuple[list[int], list[int]]:
    """A vLLM worker's CPU set as (service, compute) cores: the first `reserved` cores serve
    everything but the model's matrix work (vLLM's scheduler process, the job threads, the API,
    Redis), the others compute. At least one core always computes; with a single core both are it."""
    ordered = sorted(cpus)
    keep = min(reserved, len(ordered) - 1)
    return (ordered[:keep] or ordered), ordered[keep:]


def service_cores() -> list[int]:
    """The service cores of this process's CPUs, per `vllm_cpu_reserved_cores`: where the API
    goes beside a vLLM worker on the same machine."""
    from common.settings import get_settings

    return service_and_compute(os.sched_getaffinity(0), get_settings().vllm_cpu_reserved_cores)[0]


def confine_to(service: list[int], compute: list[int], pids: list[int]) -> int:
    """Move every thread of `pids` that is not bound inside the compute cores onto the service
    cores: the compute cores are then left to the threads vLLM bound there. Returns the number
    of threads moved; threads that end meanwhile are skipped."""
    moved, computing = 0, set(compute)
    for pid in pids:
        for tid in _threads(pid):
            try:
                if not os.sched_getaffinity(tid) <= computing:
                    os.sched_setaffinity(tid, service)
                    moved += 1
            except (ProcessLookupError, FileNotFoundError):
                pass
    return moved


def lower_priority(pid: int, nice: int) -> int:
    """Raise every thread of `pid` to niceness `nice` (threads already nicer are left as they are);
    threads it starts later inherit it from their creator. Linux keeps a niceness per thread, so
    all of them are set, not just the main one. Returns the number of threads changed."""
    changed = 0
    for tid in _threads(pid):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed += 1
        except (ProcessLookupError, FileNotFoundError):
            pass
    return changed


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _main(argv: list[str]) -> None:
    if argv[:1] == ["--service"]:
        print(format_cpus(service_cores()))
    elif argv[:1] == ["--relay-nice"]:
        from common.settings import get_settings

        print(get_settings().vllm_relay_nice)
    else:
        print("\n".join(split_cpus(os.sched_getaffinity(0), int(argv[0]))))


if __name__ == "__main__":
    _main(sys.argv[1:])
