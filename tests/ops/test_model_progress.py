"""The run command's model preparation (`python -m common.models`) reports its progress."""
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.settings import make_settings, settings_env

pytestmark = pytest.mark.slow


def test_first_preparation_shows_each_stage_then_is_cached(tmp_path):
    env = settings_env(make_settings(model_cache_dir=tmp_path, log_json=False))
    cmd = [sys.executable, "-m", "common.models"]
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    stages = [line for line in first.stderr.splitlines() if "/3]" in line]
    assert [s.split("[", 1)[1][:3] for s in stages] == ["1/3", "2/3", "3/3"], first.stderr[-3000:]
    assert "model ready at" in first.stderr
    assert first.stdout.strip() == str(tmp_path / "SmolLM2-135M-Instruct")

    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.stdout == first.stdout and "/3]" not in again.stderr  # converted once
