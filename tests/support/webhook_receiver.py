"""A real HTTP webhook receiver on 127.0.0.1 for tests: answers from a script, records requests."""
from __future__ import annotations

import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORTS = range(8300, 8400)  # the ports this project's tests may listen on


class Receiver:
    """`script(...)` sets the answers, in order, as (status, headers, delay_s) or (status, headers,
    delay_s, trickle_s): the answer then goes out one byte every `trickle_s`. Once they run out
    every request gets 200. `requests` holds {'headers', 'body', 'path', 'at'} per request received.

    Each receiver listens on a path of its own: the next test's receiver often gets the same port,
    and a delivery still on its way from an earlier test must not count as the next one's. Such a
    stray request is answered 410 Gone (the sender stops) and not recorded."""

    def __init__(self):
        self.requests: list[dict] = []
        self._script: list[tuple[int, dict, float]] = []
        self._lock = threading.Condition()
        self.hook_path = f"/hook/{uuid.uuid4().hex[:12]}"
        self.server = self._bind()
        self.url = f"http://127.0.0.1:{self.server.server_port}{self.hook_path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _bind(self) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path.split("?")[0] != receiver.hook_path:
                    self._answer(410, {})  # an earlier receiver's delivery, still retrying
                    return
                with receiver._lock:
                    receiver.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "path": self.path, "at": time.monotonic()})
                    status, headers, delay, *trickle = receiver._script.pop(0) if receiver._script \
                        else (200, {}, 0)
                    receiver._lock.notify_all()
                time.sleep(delay)
                if trickle:
                    self._trickle(status, headers, trickle[0])
                else:
                    self._answer(status, headers)

            def _answer(self, status, headers):
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up waiting (a timeout test)

            def _trickle(self, status, headers, every_s):
                head = f"HTTP/1.1 {status} Slow\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                self.close_connection = True
                try:
                    for byte in (head + "content-length: 0\r\n\r\n").encode():
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(every_s)
                except OSError:
                    pass  # the sender hung up

            def log_message(self, *args):
                pass

        for port in PORTS:
            try:
                server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
                server.daemon_threads = True
                return server
            except OSError:
                continue
        raise RuntimeError("no free port in 8300-8399 for the webhook receiver")

    def script(self, *answers: tuple[int, dict, float]) -> None:
        with self._lock:
            self._script = list(answers)

    def wait_for(self, count: int, timeout: float = 30) -> list[dict]:
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"{len(self.requests)} webhook requests arrived, expected {count}")
            return list(self.requests)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
