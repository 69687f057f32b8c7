"""A Redis high-availability group on loopback, as real processes: one master, one replica and
three sentinels (`redis-server --sentinel`), with short timeouts so a failover takes seconds.
Used by the failover and Sentinel tests and the chaos soak (bench/soak.py --chaos);
`kill_master()` is the fault they inject."""
from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis

MASTER_NAME = "llmq"


class RedisGroup:
    def __init__(self, directory: Path, next_port: Callable[[], int], down_after_ms: int = 1000,
                 failover_timeout_ms: int = 5000):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.next_port = next_port
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.servers: dict[int, subprocess.Popen] = {}  # port -> redis-server (master or replica)
        self.sentinels: dict[int, subprocess.Popen] = {}  # port -> sentinel

    # --- start / stop -------------------------------------------------------------------------
    def start(self, timeout: float = 30) -> None:
        master = self._start_server(None)
        self._start_server(master)
        for _ in range(3):
            self._start_sentinel(master)
        self.wait_settled(timeout)

    def _start_server(self, master_port: int | None) -> int:
        port = self.next_port()
        data = self.dir / f"redis-{port}"
        data.mkdir(exist_ok=True)
        args = [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                "--dir", str(data), "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                "--maxmemory-policy", "noeviction"]
        if master_port:
            args += ["--replicaof", "127.0.0.1", str(master_port)]
        self.servers[port] = subprocess.Popen(args, stdout=open(data / "redis.log", "w"),
                                              stderr=subprocess.STDOUT)
        _wait(lambda: redis.Redis(port=port).ping(), 10, f"redis on {port}")
        return port

    def _start_sentinel(self, master_port: int) -> None:
        port = self.next_port()
        conf = self.dir / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n")
        self.sentinels[port] = subprocess.Popen(
            [shutil.which("redis-server"), str(conf), "--sentinel"],
            stdout=open(self.dir / f"sentinel-{port}.log", "w"), stderr=subprocess.STDOUT)
        _wait(lambda: redis.Redis(port=port).ping(), 10, f"sentinel on {port}")

    def wait_settled(self, timeout: float = 30) -> None:
        """Every sentinel knows the master, a replica in sync and the two other sentinels."""
        def settled():
            for port in self.live_sentinels():
                s = redis.Redis(port=port, decode_responses=True)
                replicas = s.sentinel_slaves(MASTER_NAME)
                if len(s.sentinel_sentinels(MASTER_NAME)) < len(self.live_sentinels()) - 1:
                    return False
                if not any("s_down" not in r["flags"] and r.get("master-link-status") == "ok"
                           for r in replicas):
                    return False
            return True
        _wait(settled, timeout, "sentinels to see the whole group")

    def stop(self) -> None:
        for proc in [*self.sentinels.values(), *self.servers.values()]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*self.sentinels.values(), *self.servers.values()]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()

    # --- what clients need ----------------------------------------------------------------------
    @property
    def sentinels_setting(self) -> str:
        """The `LLMQ_REDIS_SENTINELS` value for this group."""
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinels)

    def live_sentinels(self) -> list[int]:
        return [port for port, proc in self.sentinels.items() if proc.poll() is None]

    def master_port(self) -> int:
        for port in self.live_sentinels():
            try:
                return int(redis.Redis(port=port).sentinel_get_master_addr_by_name(MASTER_NAME)[1])
            except redis.RedisError:
                continue
        raise RuntimeError("no sentinel answers")

    def pids(self) -> dict[str, int]:
        names = {f"redis-{p}": proc.pid for p, proc in self.servers.items() if proc.poll() is None}
        names.update({f"sentinel-{p}": proc.pid for p, proc in self.sentinels.items() if proc.poll() is None})
        return names

    # --- faults ---------------------------------------------------------------------------------
    def replication_lag_bytes(self) -> int:
        """How far the replica is behind the master (bytes of the replication stream)."""
        master = self.master_port()
        info = redis.Redis(port=master).info("replication")
        offsets = [info[k]["offset"] for k in info if k.startswith("slave") and isinstance(info[k], dict)]
        return info["master_repl_offset"] - max(offsets, default=0)

    def kill_master(self) -> int:
        """SIGKILL the current master (it stays down); returns its port."""
        port = self.master_port()
        self.servers[port].kill()
        self.servers[port].wait(10)
        return port

    def wait_failover(self, old_master: int, timeout: float = 30) -> int:
        """Until the sentinels name a new master that answers as one; returns its port."""
        def promoted():
            port = self.master_port()
            return port != old_master and redis.Redis(port=port).info("replication")["role"] == "master"
        _wait(promoted, timeout, "the sentinels to promote the replica")
        return self.master_port()

    def restart_old_master(self, port: int) -> None:
        """Bring a killed master back; the sentinels turn it into a replica of the new master."""
        self.servers.pop(port)
        data = self.dir / f"redis-{port}"
        self.servers[port] = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
             "--maxmemory-policy", "noeviction"], stdout=open(data / "redis.log", "a"), stderr=subprocess.STDOUT)
        _wait(lambda: redis.Redis(port=port).ping(), 10, f"redis on {port}")


def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, RuntimeError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"waited {timeout:.0f}s for {what}")
