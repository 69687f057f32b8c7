"""Engine child processes die with their worker, SIGKILL included.

vLLM starts helper processes with `multiprocessing` (its EngineCore, its executor workers). A
worker killed with SIGKILL runs no cleanup, so without help those children live on for minutes,
holding memory (about 650 MB each on CPU). `install()` wraps the target of every
`multiprocessing` process started afterwards, so the child's first act is
`prctl(PR_SET_PDEATHSIG, SIGKILL)`: the kernel kills it when its parent goes. The wrapper is
pickled with the process, so it works for both fork and spawn, and a child installs it again for
its own children (vLLM's executor workers are grandchildren of the worker).

The kernel sends the signal when the *thread* that started the child ends, so engines are built
on the worker's main thread (as `WorkerRuntime.build` does). Linux only; elsewhere `install()`
does nothing.
"""
from __future__ import annotations

import ctypes
import multiprocessing.process
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_installed = False


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


class DeathBound:
    """A process target that first ties the child's life to its parent's."""

    def __init__(self, target, parent_pid: int):
        self.target = target
        self.parent_pid = parent_pid

    def __setstate__(self, state):  # unpickled in a spawned child: its own children are bound too
        self.__dict__.update(state)
        install()

    def __call__(self, *args, **kwargs):
        die_with_parent(self.parent_pid)
        install()
        return self.target(*args, **kwargs)


def install() -> None:
    """Bind every `multiprocessing` child started from now on to its parent (idempotent)."""
    global _installed
    if _installed or not sys.platform.startswith("linux"):
        return
    original_start = multiprocessing.process.BaseProcess.start

    def start(self):
        if self._target is not None and not isinstance(self._target, DeathBound):
            self._target = DeathBound(self._target, os.getpid())
        return original_start(self)

    multiprocessing.process.BaseProcess.start = start
    _installed = True
