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


def redis_server_pid(port: int) -> int | None:
    """The pid of the redis-server listening on `port` on this machine, if one is."""
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] != "redis-server":
            continue
        try:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in proc.net_connections("tcp")):
                return proc.pid
        except psutil.Error:
            continue
    return None


class CoreUse:
    """Where the machine's cores went during a turn: CPU seconds of each part of a served load
    (the load's own clients, each of the server's processes, Redis), so that a server's distance
    from its engine driven in process can be read as cores the engine did not get.

    `parts` names each part's process and what of it counts: "self" (the process alone), "children"
    (its descendants alone: an llmq worker's engine processes) or "all". `start()` before the turn;
    `stop()` after it gives each part's CPU seconds since."""

    def __init__(self, parts: dict[str, tuple[int, str]]):
        self.parts = parts
        self.cores = len(psutil.Process().cpu_affinity() or []) or psutil.cpu_count()
        self._before: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        seconds = {}
        for name, (pid, what) in self.parts.items():
            try:
                if what == "self":
                    seconds[name] = cpu_seconds(pid, children=False)
                elif what == "all":
                    seconds[name] = cpu_seconds(pid)
                else:  # the descendants alone
                    seconds[name] = cpu_seconds(pid) - cpu_seconds(pid, children=False)
            except psutil.NoSuchProcess:
                seconds[name] = float("nan")
        return seconds

    def start(self) -> None:
        self._before = self._now()

    def stop(self) -> dict[str, float]:
        return {name: after - self._before[name] for name, after in self._now().items()}


def shares(cpu: dict[str, float], wall: float, cores: int) -> dict[str, float]:
    """Each part's CPU seconds as a share of all the cores over `wall`, and the rest (idle, or
    processes outside the parts)."""
    out = {name: round(seconds / (wall * cores), 3) for name, seconds in cpu.items()}
    out["rest"] = round(max(0.0, 1 - sum(out.values())), 3)
    return out


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children, in MiB; NaN once it is gone."""
    try:
        return round(sum(p.memory_info().rss for p in family(pid)) / 2**20, 1)
    except psutil.NoSuchProcess:
        return float("nan")
