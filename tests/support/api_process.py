"""The API as a process of its own, for tests that stop or switch API processes (`python -m api`)
or run it as it is deployed (gunicorn with gevent workers, `ops/gunicorn.conf.py`)."""
from __future__ import annotations

import subprocess
import sys

import psutil
import requests

from common.settings import Settings
from tests.support import ROOT
from tests.support.ports import free_port
from tests.support.settings import settings_env
from tests.support.waiting import wait_until


class ApiProcess:
    def __init__(self, settings: Settings, log_path, gunicorn: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "ab")
        command = ["-m", "api", "--port", str(self.port)]
        if gunicorn:  # one process, as deployed
            command = ["-m", "gunicorn", "-c", "ops/gunicorn.conf.py", "-w", "1", "-b", f"127.0.0.1:{self.port}",
                       "api.wsgi:app"]
        self.proc = subprocess.Popen([sys.executable, *command], cwd=ROOT, env=settings_env(settings),
                                     stdout=self._log, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout=60, interval=0.2, message="the API did not start")

    def _answers(self) -> bool:
        assert self.proc.poll() is None, f"the API process exited: {self.log_path.read_text()[-3000:]}"
        try:
            return requests.get(f"{self.url}/health", timeout=2).status_code in (200, 503)  # 503: no worker
        except requests.RequestException:
            return False

    def serving_process(self) -> psutil.Process:
        """The process that serves requests: gunicorn's worker (its master only supervises it)."""
        children = psutil.Process(self.proc.pid).children()
        return children[0] if children else psutil.Process(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
