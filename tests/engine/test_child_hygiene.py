"""Engine helper processes die with the worker that started them, even under SIGKILL.

A stand-in for vLLM: a process that installs `child_hygiene`, starts a `multiprocessing` child
(spawn, as vLLM does on CPU, or fork) which starts a grandchild (as vLLM's engine core starts its
executor), then is killed with SIGKILL. Without the hook both would live on. The hook must also
leave the child's call stack as it was: see `child_hygiene` for what one frame more cost.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import ROOT
from tests.support.waiting import wait_until
from worker.pinning import cpu_binding_env

OWNER = r"""
import multiprocessing as mp, sys, time
from worker.engine import child_hygiene

def sleeper(marks):
    open(marks + "/grandchild", "w").close()  # its target runs: bound already, if it is to be
    time.sleep(600)

def middle(method, marks):
    mp.get_context(method).Process(target=sleeper, args=(marks,)).start()
    time.sleep(600)

if __name__ == "__main__":
    if sys.argv[1] == "bound":
        child_hygiene.install()
    mp.get_context(sys.argv[2]).Process(target=middle, args=(sys.argv[2], sys.argv[3])).start()
    print("started", flush=True)
    time.sleep(600)
"""


DEPTH = r"""
import multiprocessing as mp, sys
from worker.engine import child_hygiene

def depth(queue):
    frame, n = sys._getframe(), 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    queue.put(n)

if __name__ == "__main__":
    if sys.argv[1] == "bound":
        child_hygiene.install()
    ctx = mp.get_context(sys.argv[2])
    queue = ctx.Queue()
    child = ctx.Process(target=depth, args=(queue,))
    child.start()
    print(queue.get(timeout=60))
    child.join()
"""


EXIT_SCAN = r"""
import gc, multiprocessing as mp, sys
from worker.engine import child_hygiene

class Cycle:
    def __init__(self, marks):
        self.marks, self.me = marks, self
    def __del__(self):  # runs only if the collector scans the heap at exit
        open(self.marks + "/collected", "w").close()

def leave_garbage(marks):
    gc.set_threshold(10**9)  # no collection but the one at exit, if there is one
    Cycle(marks)

if __name__ == "__main__":
    if sys.argv[1] == "bound":
        child_hygiene.install()
    child = mp.get_context("spawn").Process(target=leave_garbage, args=(sys.argv[2],))
    child.start()
    child.join()
    print(child.exitcode)
"""


def run_owner(source: str, tmp_path: Path, *args: str) -> subprocess.Popen:
    script = tmp_path / "owner.py"  # a file, not -c: spawned children import their target from it
    script.write_text(source)
    return subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def descendants_after_kill(mode: str, method: str, tmp_path: Path) -> list[psutil.Process]:
    owner = run_owner(OWNER, tmp_path, mode, method, str(tmp_path))
    try:
        assert owner.stdout.readline().strip() == "started"
        # the grandchild runs its target, so it (and the child before it) has bound itself
        wait_until(lambda: (tmp_path / "grandchild").exists(), 60, interval=0.05,
                   message="the stand-in engine did not start its processes")
        children = psutil.Process(owner.pid).children(recursive=True)
        assert len(children) >= 2 and all(c.is_running() for c in children)  # + the resource tracker
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        _, alive = psutil.wait_procs(children, timeout=10)
        return alive
    finally:
        if owner.poll() is None:
            owner.kill()


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


@linux_only
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_children_and_grandchildren_die_with_a_sigkilled_owner(tmp_path, method):
    assert descendants_after_kill("bound", method, tmp_path) == []


@linux_only
def test_without_the_hook_they_would_survive(tmp_path):
    """The check above can fail: unbound children do outlive their owner."""
    alive = descendants_after_kill("unbound", "spawn", tmp_path)
    try:
        assert alive
    finally:
        for proc in alive:
            proc.kill()


@linux_only
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_the_hook_leaves_the_childs_call_stack_as_deep_as_it_was(tmp_path, method):
    """The child runs its target at the depth it would without the hook: no wrapper frame."""
    depths = {}
    for mode in ("bound", "unbound"):
        owner = run_owner(DEPTH, tmp_path, mode, method)
        out, _ = owner.communicate(timeout=120)
        assert owner.returncode == 0
        depths[mode] = int(out.strip())
    assert depths["bound"] == depths["unbound"]


@linux_only
def test_a_spawned_child_exits_without_scanning_its_heap(tmp_path):
    """vLLM's engine process scanned its whole heap at exit, for seconds after its shutdown was
    done: past the time vLLM's client waits before killing it. A bound child skips that scan (its
    cyclic garbage is left to the kernel); an unbound one shows the check can fail."""
    for mode, collected in (("bound", False), ("unbound", True)):
        marks = tmp_path / mode
        marks.mkdir()
        out, _ = run_owner(EXIT_SCAN, tmp_path, mode, str(marks)).communicate(timeout=120)
        assert out.strip() == "0"
        assert (marks / "collected").exists() is collected, mode


def test_vllm_binds_its_threads_to_the_worker_cpu_set_less_the_reserved_cores():
    assert cpu_binding_env({0, 1, 2, 5}, reserved=1) == {"VLLM_CPU_OMP_THREADS_BIND": "1-2,5",
                                                         "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
    assert cpu_binding_env({0, 1, 2, 5}, reserved=0)["VLLM_CPU_OMP_THREADS_BIND"] == "0-2,5"
    # a one-core worker keeps its core computing whatever is reserved
    assert cpu_binding_env({3}, reserved=1) == {"VLLM_CPU_OMP_THREADS_BIND": "3",
                                                "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
