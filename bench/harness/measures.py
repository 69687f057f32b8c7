"""CPU time and memory of the processes under test, read with psutil."""
from __future__ import annotations

import psutil


def family(pid: int) -> list[psutil.Process]:
    """A process and all its children (gunicorn's worker, an engine's processes)."""
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU seconds so far of a process (and, by default, its children)."""
    total = 0.0
    for proc in family(pid) if children else [psutil.Process(pid)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MiB; NaN once it is gone."""
    try:
        return round(sum(p.memory_info().rss for p in family(pid)) / 2**20, 1)
    except psutil.NoSuchProcess:
        return float("nan")
