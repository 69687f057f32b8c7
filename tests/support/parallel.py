"""Which of pytest-xdist's worker processes this is (`bash ops/test.sh` runs modules in
parallel), so each takes Redis and ports of its own: index 0 of 1 when run without xdist."""
from __future__ import annotations

import os


def worker_index() -> int:
    """0 for xdist's "gw0" (or no xdist), 1 for "gw1", ..."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def worker_count() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
