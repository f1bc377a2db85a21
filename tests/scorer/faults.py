"""Real loopback servers that misbehave the ways a scorer worker can: hang, or answer 5xx."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Counter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def inc(self) -> None:
        with self._lock:
            self.value += 1


@contextmanager
def hanging_server() -> Iterator[tuple[str, Counter]]:
    """Accepts connections and never answers; yields (URL, connections accepted)."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted, held = Counter(), []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)  # keep it open: the client waits for an answer that never comes
            accepted.inc()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


@contextmanager
def failing_server(status: int = 503) -> Iterator[tuple[str, Counter]]:
    """Answers every request with `status`; yields (URL, requests received)."""
    received = Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.inc()
            self.rfile.read(int(self.headers.get("content-length", 0)))
            body = b'{"error": {"type": "internal_error", "message": "injected", "param": null}}'
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
