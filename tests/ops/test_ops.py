"""The ops scripts' process handling, run for real: Flower as `ops/run.sh` starts it (API open on
localhost), Redis as the scripts start it (append-only file, noeviction), and `ops/stop.sh`
stopping exactly what the scripts started."""
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
import requests

from tests.support import ROOT
from tests.support.ports import free_port, redis_port
from tests.support.settings import make_settings, settings_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def ops(script: str, run_dir, settings, **env) -> subprocess.CompletedProcess:
    """Run bash code with ops/common.sh sourced, in a private run directory."""
    full_env = settings_env(settings) | {"LLMQ_RUN_DIR": str(run_dir), "PYTHON": sys.executable} | env
    return subprocess.run(["bash", "-c", f"source ops/common.sh; {script}"], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def wait_for(check, timeout=60):
    """`check` holds within `timeout` seconds (a server still starting counts as not yet)."""
    wait_until(check, timeout, interval=0.3, ignoring=(requests.RequestException, redis.RedisError))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(") ")[1].startswith("Z")


def test_flower_as_run_sh_starts_it_answers_its_api_on_localhost(tmp_path):
    settings = make_settings()
    port = free_port()
    result = ops(f"start_flower {port}", tmp_path, settings)
    assert result.returncode == 0, result.stderr
    pid = int((tmp_path / "flower.pid").read_text())
    try:
        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=2).ok)
        resp = requests.get(f"http://127.0.0.1:{port}/api/workers", timeout=10)
        assert resp.status_code == 200, resp.text  # Flower's default is 401 without a login
        assert isinstance(resp.json(), dict)
    finally:
        ops("bash ops/stop.sh", tmp_path, settings)
    wait_for(lambda: not alive(pid), 30)


def test_scripts_start_a_durable_redis_and_stop_sh_stops_only_what_they_started(tmp_path):
    settings = make_settings()
    theirs_port, ours_port = redis_port(), redis_port()
    theirs = subprocess.Popen(["redis-server", "--port", str(theirs_port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        wait_for(lambda: redis.Redis(port=theirs_port).ping())
        # a Redis that already answers is used as it is, and not taken over
        result = ops("ensure_redis", tmp_path, settings, LLMQ_REDIS_URL=f"redis://127.0.0.1:{theirs_port}/0")
        assert result.returncode == 0, result.stderr
        assert not (tmp_path / "redis.pid").exists()

        # none answers: one is started, durable (append-only file, fsync every second, noeviction)
        result = ops("ensure_redis && start_bg worker sleep 300", tmp_path, settings,
                     LLMQ_REDIS_URL=f"redis://127.0.0.1:{ours_port}/0")
        assert result.returncode == 0, result.stderr
        ours = redis.Redis(port=ours_port, decode_responses=True)
        config = {k: v for name in ("appendonly", "appendfsync", "maxmemory-policy")
                  for k, v in ours.config_get(name).items()}
        assert config == {"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}
        redis_pid = int((tmp_path / "redis.pid").read_text())
        worker_pid = int((tmp_path / "worker.pid").read_text())
        # a pid file left over from long ago whose pid now belongs to someone else
        (tmp_path / "api.pid").write_text(str(bystander.pid))
        os.utime(tmp_path / "api.pid", (time.time() - 3600, time.time() - 3600))

        assert ops("bash ops/stop.sh --keep-redis", tmp_path, settings).returncode == 0  # as run.sh restarts
        wait_for(lambda: not alive(worker_pid), 30)
        assert alive(redis_pid)

        assert ops("bash ops/stop.sh", tmp_path, settings).returncode == 0
        wait_for(lambda: not alive(redis_pid), 30)
        assert list(tmp_path.glob("*.pid")) == []
        assert redis.Redis(port=theirs_port).ping() and bystander.poll() is None  # left alone
        assert (tmp_path / "appendonlydir").is_dir()  # its data stays for the next start
    finally:
        for proc in (theirs, bystander):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
