"""What the soak's two loads (bench/soak.py: jobs, and OpenAI background responses) share: client
threads that loop until the soak's time is up, their counts under one lock, and notes shown with
`--verbose`; at the end, `reconcile()` reads everything back."""
from __future__ import annotations

import sys
import threading
import time
from collections import Counter


class SoakClients:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.stop_at = time.monotonic() + args.duration

    def client(self, n: int) -> None:
        raise NotImplementedError

    def reconcile(self) -> dict:
        raise NotImplementedError

    def run(self) -> dict:
        """`--clients` client threads until the duration and the drain are over; then the report."""
        threads = [threading.Thread(target=self.client, args=(n,), daemon=True) for n in range(self.args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.args.duration + self.args.drain + 60)
        return self.reconcile()

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def note(self, message: str) -> None:
        if self.args.verbose:
            print(message, file=sys.stderr)
