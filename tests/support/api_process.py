"""The API as a process of its own (`python -m api`), for tests that stop or switch API processes."""
from __future__ import annotations

import subprocess
import sys

import requests

from common.settings import Settings
from tests.support import ROOT
from tests.support.ports import free_port
from tests.support.settings import settings_env
from tests.support.waiting import wait_until


class ApiProcess:
    def __init__(self, settings: Settings, log_path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "api", "--port", str(self.port)], cwd=ROOT,
                                     env=settings_env(settings), stdout=self._log, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout=60)

    def _answers(self) -> bool:
        assert self.proc.poll() is None, "the API process exited"
        try:
            return requests.get(f"{self.url}/health", timeout=1).status_code < 500
        except requests.RequestException:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._log.close()
