"""A loopback HTTP fault proxy for the interop suite (stdlib only).

    fault_proxy.py LISTEN_PORT UPSTREAM_PORT LOG [--cut-after-progress TEXT]

Forwards each HTTP request arriving on 127.0.0.1:LISTEN_PORT to
127.0.0.1:UPSTREAM_PORT, one request per connection (it asks the upstream
for `Connection: close`, so the upstream ends each answer by closing, and the
client sees that too). With `--cut-after-progress`, the first POST whose body
contains every `|`-separated part of TEXT has its answer cut: the proxy
forwards it up to the end of the first SSE event carrying
`notifications/progress`, then closes both connections, as a network
failure would.

More faults are armed at run time by POSTing a JSON object to the proxy's
own path `/_fault` (never forwarded); each fault hits one request, the
first one after it was armed that matches it (`match`: `|`-separated parts
its body must all contain; `get`: true for a GET instead of a POST):

* `{"mode": "refuse", "seconds": S}`: closes the listening port now and
  opens it again S seconds later (connections are refused meanwhile);
* `{"mode": "reset"}`: forwards the request, reads the whole answer, then
  resets the client's connection (SO_LINGER 0: a TCP RST) without a byte;
* `{"mode": "cut", "events": N}`: forwards the answer up to the end of its
  Nth SSE event, then closes both connections; with `"after": TEXT`
  instead of `events`, up to the end of the first event containing TEXT;
* `{"mode": "delay", "seconds": S}`: waits S seconds, then forwards;
* `{"mode": "status", "status": CODE, "retry_after": "1" or null}`:
  answers CODE itself (a JSON-RPC error body) without forwarding; with
  CODE 404 it only hits a request carrying an `Mcp-Session-Id` (the
  session is "lost").

Every request is logged to LOG as a JSON line: its method, its
`Last-Event-ID` header (or null), its JSON-RPC method, whether it carried a
session id, whether it was cut (`cut`) and the armed fault that hit it
(`fault`: the mode, "status CODE" for a status, or null).
"""
from __future__ import annotations

import argparse
import json
import re
import socket
import struct
import threading
import time
from typing import Any, Callable

LOCK = threading.Lock()
EVENT_END = re.compile(rb"\r?\n\r?\n")
REASONS = {404: "Not Found", 429: "Too Many Requests", 502: "Bad Gateway", 503: "Service Unavailable"}


def read_request(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The request's head (through the blank line) and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    match = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    length = int(match.group(1)) if match else 0
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head + b"\r\n\r\n", body


def with_close(head: bytes) -> bytes:
    """The head with `Connection: close` instead of any Connection header."""
    lines = [l for l in head.rstrip(b"\r\n").split(b"\r\n") if not l.lower().startswith(b"connection:")]
    return b"\r\n".join(lines + [b"Connection: close"]) + b"\r\n\r\n"


def reset(conn: socket.socket) -> None:
    """Closes `conn` with a TCP RST instead of a FIN."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def status_answer(status: int, retry_after: str | None) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": None,
                       "error": {"code": -32000, "message": f"fault proxy: {status}"}}).encode()
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def cut_after_text(text: bytes) -> Callable[[bytes], int | None]:
    """Where the first event carrying `text` ends."""

    def find(seen: bytes) -> int | None:
        at = seen.find(text)
        end = EVENT_END.search(seen, at) if at >= 0 else None
        return end.end() if end else None

    return find


def cut_after_events(n: int) -> Callable[[bytes], int | None]:
    """Where the `n`th SSE event of the answer ends (its head excluded)."""

    def find(seen: bytes) -> int | None:
        head_end = seen.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        at, count = head_end + 4, 0
        while count < n:
            end = EVENT_END.search(seen, at)
            if end is None:
                return None
            at, count = end.end(), count + 1
        return at

    return find


class Proxy:
    def __init__(self, port: int, upstream: int, log: str, cut: list[str]) -> None:
        self.port = port
        self.upstream = upstream
        self.log = log
        self.cut = [c.encode() for c in cut]
        self.cut_done = False
        self.armed: list[dict[str, Any]] = []
        self.listener: socket.socket | None = None
        self.listen()

    def listen(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener

    def refuse(self, seconds: float) -> None:
        """Closes the port for `seconds` (accept() in run() wakes up)."""
        with LOCK:
            listener, self.listener = self.listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        time.sleep(seconds)
        self.listen()

    def run(self) -> None:
        while True:
            listener = self.listener
            if listener is None:
                time.sleep(0.01)
                continue
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def record(self, entry: dict) -> None:
        with LOCK, open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def take_fault(self, is_get: bool, body: bytes, has_session: bool) -> dict[str, Any] | None:
        with LOCK:
            for i, f in enumerate(self.armed):
                if bool(f.get("get")) != is_get:
                    continue
                if not all(p.encode() in body for p in (f.get("match") or "").split("|") if p):
                    continue
                if f["mode"] == "status" and f["status"] == 404 and not has_session:
                    continue
                return self.armed.pop(i)
        return None

    def serve(self, client: socket.socket) -> None:
        with client:
            request = read_request(client)
            if request is None:
                return
            head, body = request
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            if first.split(" ")[1:2] == ["/_fault"]:
                fault = json.loads(body)
                if fault["mode"] != "refuse":
                    with LOCK:
                        self.armed.append(fault)  # armed before the answer says so
                client.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                client.shutdown(socket.SHUT_RDWR)
                if fault["mode"] == "refuse":
                    self.refuse(float(fault["seconds"]))
                return
            last_id = re.search(rb"(?im)^last-event-id:\s*(.*?)\s*$", head)
            has_session = re.search(rb"(?im)^mcp-session-id:", head) is not None
            try:
                rpc_method = json.loads(body).get("method") if body else None
            except (ValueError, AttributeError):
                rpc_method = None
            with LOCK:
                cut = (
                    not self.cut_done
                    and first.startswith("POST ")
                    and bool(self.cut)
                    and all(part in body for part in self.cut)
                )
                self.cut_done = self.cut_done or cut
            fault = None if cut else self.take_fault(first.startswith("GET "), body, has_session)
            mode = fault["mode"] if fault else None
            self.record({
                "method": first.split(" ", 1)[0],
                "last_event_id": last_id.group(1).decode("latin-1") if last_id else None,
                "rpc_method": rpc_method,
                "session": has_session,
                "cut": cut,
                "fault": f"status {fault['status']}" if mode == "status" else mode,
            })
            if mode == "status":
                client.sendall(status_answer(int(fault["status"]), fault.get("retry_after")))
                return
            if mode == "delay":
                time.sleep(float(fault["seconds"]))
            until = None
            if cut:
                until = cut_after_text(b"notifications/progress")
            elif mode == "cut" and "after" in fault:
                until = cut_after_text(fault["after"].encode())
            elif mode == "cut":
                until = cut_after_events(int(fault["events"]))
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                reset(client)  # the upstream is down: so is the connection
                return
            with up:
                up.sendall(with_close(head) + body)
                if mode == "reset":
                    while up.recv(65536):
                        pass  # the whole answer, then nothing of it
                    reset(client)
                    return
                self.forward(up, client, until)

    @staticmethod
    def forward(up: socket.socket, client: socket.socket, until: Callable[[bytes], int | None] | None) -> None:
        """Forwards the answer; with `until`, only up to where it says,
        then closes both connections."""
        seen = b""
        while True:
            try:
                chunk = up.recv(65536)
                if not chunk:
                    return
                if until is not None:
                    seen += chunk
                    end = until(seen)
                    if end is not None:
                        client.sendall(chunk[: len(chunk) - (len(seen) - end)])
                        client.shutdown(socket.SHUT_RDWR)
                        return
                client.sendall(chunk)
            except OSError:
                return  # either side went away


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("upstream", type=int)
    ap.add_argument("log")
    ap.add_argument("--cut-after-progress", default="")
    args = ap.parse_args()
    Proxy(args.port, args.upstream, args.log, [p for p in args.cut_after_progress.split("|") if p]).run()


if __name__ == "__main__":
    main()
