"""Faults for the soak (`bench/soak.py --chaos`): kill -9 of a random worker of the stack every so
often (each is restarted at once, as a supervisor would), and one master failover of its Redis
Sentinel group (tests/support/redis_group.py) at a set time."""
from __future__ import annotations

import random
import threading
import time


class Chaos(threading.Thread):
    def __init__(self, stack, redis_group, kill_every_s: tuple[float, float], failover_at_s: float | None,
                 stop_at: float, seed: int = 0):
        super().__init__(daemon=True)
        self.stack, self.redis_group = stack, redis_group
        self.kill_every_s, self.failover_at_s = kill_every_s, failover_at_s
        self.stop_at, self.rng = stop_at, random.Random(seed)
        self.started = time.monotonic()
        self.events: list[dict] = []
        self.done = threading.Event()

    def run(self) -> None:
        next_kill = self.started + self.rng.uniform(*self.kill_every_s)
        failover_at = self.started + self.failover_at_s if self.failover_at_s is not None else None
        while not self.done.is_set() and time.monotonic() < self.stop_at:
            now = time.monotonic()
            if failover_at is not None and now >= failover_at:
                self.failover()
                failover_at = None
            elif now >= next_kill:
                name = self.rng.choice(self.stack.worker_names())
                self.stack.kill_worker(name)
                self.note("worker_killed", worker=name)
                self.stack.start_worker(name)
                next_kill = now + self.rng.uniform(*self.kill_every_s)
            self.done.wait(0.2)

    def failover(self) -> None:
        group = self.redis_group
        old = group.kill_master()
        killed = time.monotonic()
        self.note("redis_master_killed", port=old)
        new = group.wait_failover(old, timeout=60)
        self.note("redis_replica_promoted", port=new, switch_s=round(time.monotonic() - killed, 2))
        group.restart_old_master(old)  # comes back as a replica of the new master
        self.note("old_master_back_as_replica", port=old)

    def note(self, event: str, **fields) -> None:
        self.events.append({"t": round(time.monotonic() - self.started, 1), "event": event, **fields})
