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

from tests.conftest import ROOT, free_port, make_settings, settings_env

pytestmark = pytest.mark.slow


def ops(script: str, run_dir, settings, **env) -> subprocess.CompletedProcess:
    """Run bash code with ops/common.sh sourced, in a private run directory."""
    full_env = settings_env(settings) | {"LLMQ_RUN_DIR": str(run_dir), "PYTHON": sys.executable} | env
    return subprocess.run(["bash", "-c", f"source ops/common.sh; {script}"], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


def wait_until(check, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except (requests.RequestException, redis.RedisError):
            pass
        time.sleep(0.3)
    return False


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
        assert wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=2).ok)
        resp = requests.get(f"http://127.0.0.1:{port}/api/workers", timeout=10)
        assert resp.status_code == 200, resp.text  # Flower's default is 401 without a login
        assert isinstance(resp.json(), dict)
    finally:
        ops("bash ops/stop.sh", tmp_path, settings)
    assert wait_until(lambda: not alive(pid), 30)
