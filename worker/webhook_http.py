"""The HTTP side of one webhook attempt: it reaches only addresses webhooks may reach, and it ends
within one deadline in all.

A socket timeout bounds each read, not the attempt: a receiver that trickles its answer a byte at a
time would hold a control worker's thread for as long as it likes. Under `AttemptDeadline` the
host's lookup waits at most the time left and, when the time is up, a watchdog shuts the attempt's
connections down under the blocked read or write.
"""
from __future__ import annotations

import socket
import threading
import time

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NameResolutionError, NewConnectionError

from common.webhook_rules import address_allowed, resolve


class BlockedAddress(Exception):
    """The connection reached an address webhooks may not reach (checked after connecting)."""


class AttemptDeadline:
    """The end of one attempt, for the thread making it: `with AttemptDeadline(s):` around the
    request. At the deadline the sockets the attempt holds are shut down (through a duplicate of
    each, which stays valid whatever becomes of the original: TLS takes it over), so a read or
    write blocked on one returns at once; a socket taken after the deadline is shut down as it
    is taken. `passed` says whether the attempt ran out of time."""

    _local = threading.local()

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.ends_at = time.monotonic() + seconds
        self.passed = False
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    @classmethod
    def current(cls) -> AttemptDeadline | None:
        return getattr(cls._local, "deadline", None)

    def left(self) -> float:
        return max(0.0, self.ends_at - time.monotonic())

    def hold(self, sock: socket.socket) -> None:
        """Cut `sock` at the deadline (at once if it has passed)."""
        dup = socket.fromfd(sock.fileno(), sock.family, sock.type)
        with self._lock:
            self._held.append(dup)
            if self.passed:
                _shut(dup)

    def _cut(self) -> None:
        with self._lock:
            self.passed = True
            for sock in self._held:
                _shut(sock)

    def __enter__(self) -> AttemptDeadline:
        AttemptDeadline._local.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        AttemptDeadline._local.deadline = None
        with self._lock:
            for sock in self._held:
                sock.close()
            self._held.clear()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the other end


def guarded_http(allow: str, maxsize: int) -> urllib3.PoolManager:
    """An HTTP client that checks the address each connection actually reached, before sending
    a byte: a name that resolved to a public address at submit time but to a private one now
    (DNS rebinding) is refused. No proxies (urllib3 reads none from the environment). Inside an
    `AttemptDeadline`, the host's lookup waits at most the time left, and each connection is
    held to the deadline."""
    def guarded(conn_cls):
        class Guarded(conn_cls):
            def _new_conn(self):
                deadline = AttemptDeadline.current()
                sock = self._connect_within(deadline) if deadline else super()._new_conn()
                peer = sock.getpeername()[0]
                if not address_allowed(peer, allow):
                    sock.close()
                    raise BlockedAddress(f"{self.host} resolved to {peer}, which webhooks may not "
                                         "reach (private, loopback, link-local or other non-public)")
                if deadline:
                    deadline.hold(sock)
                return sock

            def _connect_within(self, deadline: AttemptDeadline):
                """Resolve the host on the bounded lookup pool, then connect to its addresses in
                turn (urllib3's own connect would look it up again, with no bound)."""
                host = self._dns_host
                try:
                    addresses = resolve(host.strip("[]"), self.port, deadline.left())
                except (socket.gaierror, UnicodeError) as exc:
                    raise NameResolutionError(self.host, self, socket.gaierror(str(exc))) from exc
                error: Exception = NewConnectionError(self, f"{self.host} has no address")
                for address in addresses:
                    self._dns_host, timeout = address, self.timeout
                    self.timeout = min(timeout, deadline.left()) if isinstance(timeout, float | int) \
                        else deadline.left()
                    try:
                        return super()._new_conn()
                    except NewConnectionError as exc:  # (connect timeouts included)
                        error = exc
                    finally:
                        self._dns_host, self.timeout = host, timeout
                raise error

            def request(self, *args, **kwargs):
                deadline = AttemptDeadline.current()
                if deadline and self.sock is not None:  # a kept-alive connection, used again
                    deadline.hold(self.sock)
                return super().request(*args, **kwargs)
        return Guarded

    class HTTPPool(HTTPConnectionPool):
        ConnectionCls = guarded(HTTPConnection)

    class HTTPSPool(HTTPSConnectionPool):
        ConnectionCls = guarded(HTTPSConnection)

    http = urllib3.PoolManager(num_pools=64, maxsize=maxsize)
    http.pool_classes_by_scheme = {"http": HTTPPool, "https": HTTPSPool}
    return http
