"""ops/demo_client.py, the demo `ops/run.sh` ends with, against an API with keys on: it streams
the answer with the key in LLMQ_API_KEY (which run.sh passes on), and without a key, or with one
the API refuses, it says what to do instead of ending in a bare 401."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from api import create_app
from common.api_keys import hash_key
from tests.support import ROOT
from tests.support.servers import LiveServer

pytestmark = pytest.mark.slow

KEY = "demo-key-0123456789"


@pytest.fixture(scope="module")
def keyed_api(stack_settings, worker):
    """The API with one key configured, in front of the session's shared worker: its URL."""
    server = LiveServer(create_app(stack_settings.model_copy(update={"api_keys": f"demo:{hash_key(KEY)}"})))
    yield server.url
    server.stop()


def demo(url: str, key: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LLMQ_API_KEY"} | ({"LLMQ_API_KEY": key} if key else {})
    return subprocess.run([sys.executable, "ops/demo_client.py", "--api", url, "--wait-ready", "60",
                           "--max-tokens", "8", "Say hello."], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_demo_streams_an_answer_with_the_key_it_is_given(keyed_api):
    done = demo(keyed_api, KEY)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the answer's text
    assert "[succeeded, finish_reason=" in done.stderr


@pytest.mark.parametrize("key, problem", [(None, "the demo had none"), ("not-a-key", "it refused the demo's key")])
def test_without_a_good_key_the_demo_says_how_to_give_one(keyed_api, key, problem):
    done = demo(keyed_api, key)
    assert done.returncode != 0
    assert problem in done.stderr and "LLMQ_API_KEY=<key> bash ops/run.sh" in done.stderr
    assert "Traceback" not in done.stderr
