"""Engine child processes die with their worker, SIGKILL included; and a worker dies with them.

vLLM starts helper processes with `multiprocessing` (its EngineCore, its executor workers). A
worker killed with SIGKILL runs no cleanup, so without help those children live on for minutes,
holding memory (about 650 MB each on CPU). `install()` makes every `multiprocessing` child started
afterwards (fork or spawn, what vLLM uses) call `prctl(PR_SET_PDEATHSIG, SIGKILL)` before it runs
its target: the kernel then kills it when its parent goes. A forked child does so from
`multiprocessing`'s after-fork hooks, which it inherits; a spawned one while it unpickles its
process object, and it installs the hook again for its own children (vLLM's executor workers are
grandchildren of the worker).

Nothing is wrapped around the child's target, nor around `Process.start` (a forked child runs on
the copy of its parent's stack): a wrapper adds one frame under all of the child's code, and on
CPython 3.11 that can be ruinous. Each thread keeps its frames in 16 KiB chunks, and a call that
crosses the end of a chunk maps a new one, which the return unmaps again (later CPythons keep a
spare chunk). One frame more moved vLLM's per-step calls onto such an end: its compute process took
180 page faults per decode step instead of 60, and each step was 10% longer (135M model, one
request: 28.3 against 25.5 ms).

The kernel sends the signal when the *thread* that started the child ends, so engines are built
on the worker's main thread (as `WorkerRuntime.build` does). Linux only; elsewhere `install()`
does nothing.

A spawned child also leaves its heap to the kernel at exit instead of having the collector scan
it: vLLM's engine process spent seconds on that scan after its shutdown was done, and was killed
by its parent's deadline more often than it ended by itself.

The other way round, an engine whose process (or any of its parallel ranks) dies cannot finish the
jobs it holds: `exit_for_redelivery` ends the worker at once, as vLLM's server goes when its engine
core does, so that the jobs' leases lapse and another worker runs them, rather than failing them.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import signal
import sys
import threading
from typing import Callable

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1
_installed = False
EXIT_ENGINE_DIED = 70  # EX_SOFTWARE: what a supervisor sees when a worker left for this reason
# Set at interpreter exit, before multiprocessing ends its children (atexit runs last-registered
# first, and multiprocessing is imported above): an engine process ended that way is no crash.
EXITING = threading.Event()
atexit.register(EXITING.set)


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits; exit now if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


class _BindOnArrival:
    """Pickled with a spawned process: unpickling it in the child, before the child's target
    runs, binds the child to its parent and installs the hook there."""

    def __init__(self, parent_pid: int):
        self.parent_pid = parent_pid

    def __reduce__(self):
        return _arrive, (self.parent_pid,)


def _arrive(parent_pid: int) -> None:
    die_with_parent(parent_pid)
    install()
    # Last of the child's exit handlers (they run newest first): what is left then is garbage for
    # the kernel to take back, and the collector's full scan of it at interpreter exit held vLLM's
    # engine process for seconds after its own shutdown was done, past the time its parent waits
    # before killing it. vLLM freezes the heap at exit for the same reason, on ROCm only.
    atexit.register(gc.freeze)


class _Anchor:
    """What the after-fork hook is registered on (`multiprocessing` keeps it by weak reference)."""


_ANCHOR = _Anchor()


def _bind_to_parent(_anchor: _Anchor) -> None:
    """Runs in every forked `multiprocessing` child, before its target (spawned ones skip it)."""
    die_with_parent(multiprocessing.parent_process().pid)


def install() -> None:
    """Bind every `multiprocessing` child started from now on to its parent (idempotent)."""
    global _installed
    if _installed or not sys.platform.startswith("linux"):
        return
    from multiprocessing import popen_spawn_posix  # POSIX only: imported where it is needed

    multiprocessing.util.register_after_fork(_ANCHOR, _bind_to_parent)
    original_launch = popen_spawn_posix.Popen._launch

    def launch(self, process_obj):  # spawn only, in the parent: the child starts a fresh stack
        process_obj._bind_on_arrival = _BindOnArrival(os.getpid())
        return original_launch(self, process_obj)

    popen_spawn_posix.Popen._launch = launch
    _installed = True


def exit_for_redelivery(what: str, held_jobs: int) -> None:
    """The engine's process died under this worker: leave now (exit 70) so that the jobs it held
    are redelivered to a live worker when their leases lapse."""
    log.critical("%s; the worker exits so that its %d jobs are redelivered", what, held_jobs)
    logging.shutdown()
    os._exit(EXIT_ENGINE_DIED)


def exit_when_any_ends(processes: list, what: str, held_jobs: Callable[[], int],
                       expected: Callable[[], bool]) -> None:
    """Watch `processes` (multiprocessing children) from a daemon thread; when one ends and
    `expected()` is false (no close under way, no interpreter exit), `exit_for_redelivery`."""
    if not processes:
        return

    def watch():
        ended = multiprocessing.connection.wait([p.sentinel for p in processes])
        if expected() or EXITING.is_set():
            return
        process = next(p for p in processes if p.sentinel == ended[0])
        exit_for_redelivery(f"{what} {process.name} died (exit code {process.exitcode})", held_jobs())

    threading.Thread(target=watch, name="engine-process-watch", daemon=True).start()
