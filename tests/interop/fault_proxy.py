"""A loopback HTTP fault proxy for the interop suite (stdlib only).

    fault_proxy.py LISTEN_PORT UPSTREAM_PORT LOG --cut-after-progress TEXT

Forwards each HTTP request arriving on 127.0.0.1:LISTEN_PORT to
127.0.0.1:UPSTREAM_PORT, one request per connection (it asks the upstream
for `Connection: close`, so the upstream ends each answer by closing, and the
client sees that too). The first POST whose body contains every
`|`-separated part of TEXT has its answer cut: the proxy forwards it up to
the end of the first SSE event carrying `notifications/progress`, then
closes both connections, as a network failure would. Every request is
logged to LOG as a JSON line: its method, its `Last-Event-ID` header (or
null), its JSON-RPC method and whether it was cut.
"""
from __future__ import annotations

import argparse
import json
import re
import socket
import threading

LOCK = threading.Lock()


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


class Proxy:
    def __init__(self, upstream: int, log: str, cut: list[str]) -> None:
        self.upstream = upstream
        self.log = log
        self.cut = [c.encode() for c in cut]
        self.cut_done = False

    def record(self, entry: dict) -> None:
        with LOCK, open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def serve(self, client: socket.socket) -> None:
        with client:
            request = read_request(client)
            if request is None:
                return
            head, body = request
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            last_id = re.search(rb"(?im)^last-event-id:\s*(.*?)\s*$", head)
            try:
                rpc_method = json.loads(body).get("method") if body else None
            except ValueError:
                rpc_method = None
            with LOCK:
                cut = (
                    not self.cut_done
                    and first.startswith("POST ")
                    and bool(self.cut)
                    and all(part in body for part in self.cut)
                )
                self.cut_done = self.cut_done or cut
            self.record({
                "method": first.split(" ", 1)[0],
                "last_event_id": last_id.group(1).decode("latin-1") if last_id else None,
                "rpc_method": rpc_method,
                "cut": cut,
            })
            with socket.create_connection(("127.0.0.1", self.upstream)) as up:
                up.sendall(with_close(head) + body)
                seen = b""
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        return
                    if cut:
                        seen += chunk
                        at = seen.find(b"notifications/progress")
                        end = re.compile(rb"\r?\n\r?\n").search(seen, at) if at >= 0 else None
                        if end is not None:
                            # Up to the end of that event, then the cut.
                            client.sendall(chunk[: len(chunk) - (len(seen) - end.end())])
                            client.shutdown(socket.SHUT_RDWR)
                            return
                    client.sendall(chunk)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("upstream", type=int)
    ap.add_argument("log")
    ap.add_argument("--cut-after-progress", default="")
    args = ap.parse_args()
    proxy = Proxy(args.upstream, args.log, [p for p in args.cut_after_progress.split("|") if p])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(64)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=proxy.serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
