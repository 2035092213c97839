#!/usr/bin/env python3
"""What a notification costs the call after it through `mcp-retry run --url`.

    notify_order.py PATH/TO/mcp-retry [--calls N] [--rounds R] [--slow-ack MS] [--url URL]

The Streamable HTTP transport keeps the order the client sent lines in: the
message after a notification is posted once the notification's POST was
answered (202). This script measures what that costs a `tools/call` that
follows a notification at once.

It starts a minimal Streamable HTTP MCP server (standard library only, one
thread per connection, HTTP/1.1 keep-alive, Nagle off, each answer written
in one `send`) on loopback: `initialize` sets a session, `tools/list` lists
`echo`, `tools/call` answers with JSON at once, the standalone GET stream
gets 405, and a notification gets 202 after the delay its
`params._meta.ackDelayMs` asks for (0 if none). It then runs
`mcp-retry run --url` with no config file and drives it over stdio as an
MCP client does (initialize, initialized, `tools/list`, 20 warm-up calls),
timing each `tools/call` from the moment the client writes its lines until
the call's answer is read, in three workloads that take turns in every
round (rotating which goes first), so that load from elsewhere on the
machine falls on all three alike:

* `call`: the `tools/call` alone;
* `note+call`: `notifications/roots/list_changed`, which the server
  acknowledges at once, written immediately before the call;
* `slow note+call`: the same notification, acknowledged after `--slow-ack`
  ms (default 50): the worst case a server can impose, up to the 2 s a
  line waits for those before it.

The server runs in the script's process and notes when it has read each
message, on the same clock, so the script also prints where the time goes:
to the notification's arrival, from it to the call's, and back. It checks
that every notification arrived before the call written after it (exit
status 1 if one did not). `--slow-ack` over 2000 shows the bound: the call
then waits 2 s.

With `--url URL` (plain http) the proxy is put in front of that server
instead (it needs an `echo(message)` tool, as tests/interop/py_http_server.py
has): only the first two workloads, no split, and then the server's own
time to acknowledge a notification, posted directly in a session of the
script's own.
"""
import argparse
import http.client
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

arrivals = []  # (kind, tag, ns) in the order the server read them
arrivals_lock = threading.Lock()

TOOLS = [{"name": "echo", "description": "Echoes its argument.",
          "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}}}]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def reply(self, status, payload=None, headers=()):
        data = b"" if payload is None else json.dumps(payload).encode()
        head = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
                f"Content-Length: {len(data)}"]
        if payload is not None:
            head.append("Content-Type: application/json")
        head += [f"{k}: {v}" for k, v in headers]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)

    def do_GET(self):
        self.reply(405)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        msg = json.loads(self.body())
        method = msg.get("method")
        if "id" not in msg or method is None:  # a notification (or a response)
            params = msg.get("params") or {}
            meta = params.get("_meta") or {}
            with arrivals_lock:
                arrivals.append(("note", meta.get("tag"), time.perf_counter_ns()))
            delay = meta.get("ackDelayMs", 0)
            if delay:
                time.sleep(delay / 1000)
            return self.reply(202)
        if method == "initialize":
            return self.reply(200, {"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "notify-order", "version": "1"}}},
                [("Mcp-Session-Id", "s1")])
        if method == "tools/list":
            return self.reply(200, {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": TOOLS}})
        if method == "tools/call":
            text = msg["params"]["arguments"]["message"]
            with arrivals_lock:
                arrivals.append(("call", text, time.perf_counter_ns()))
            return self.reply(200, {"jsonrpc": "2.0", "id": msg["id"], "result": {
                "content": [{"type": "text", "text": text}]}})
        self.reply(200, {"jsonrpc": "2.0", "id": msg["id"],
                         "error": {"code": -32601, "message": "method not found"}})


class Client:
    """An MCP client on the proxy's stdin and stdout."""

    def __init__(self, argv, env):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env)
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.p.stderr), daemon=True).start()
        self.next_id = 0

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def request(self, method, params, before=None):
        """Sends `before` (a notification) and the request back to back;
        returns the answer, and when the first line was written and when
        the answer was read (perf_counter ns)."""
        self.next_id += 1
        start = time.perf_counter_ns()
        if before is not None:
            self.send(before)
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                sys.exit("the proxy closed its stdout:\n" + b"".join(self.log).decode(errors="replace"))
            msg = json.loads(line)
            if msg.get("id") == self.next_id:
                return msg, start, time.perf_counter_ns()


def direct_acks(url, count):
    """Times `count` notification POSTs to `url` in a session of their own,
    each until its 202 (ms)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80)
    headers = {"Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}

    def post(msg):
        conn.request("POST", u.path or "/", json.dumps(msg), headers)
        r = conn.getresponse()
        r.read()
        return r

    r = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "notify_order", "version": "1"}}})
    if r.getheader("Mcp-Session-Id"):
        headers["Mcp-Session-Id"] = r.getheader("Mcp-Session-Id")
    headers["MCP-Protocol-Version"] = "2025-11-25"
    post({"jsonrpc": "2.0", "method": "notifications/initialized"})
    times = []
    for _ in range(count):
        start = time.perf_counter_ns()
        r = post({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
        times.append((time.perf_counter_ns() - start) / 1e6)
        assert r.status == 202, r.status
    return times


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("proxy")
    ap.add_argument("--calls", type=int, default=500, help="calls per workload")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--slow-ack", type=float, default=50, help="ms before the slow 202")
    ap.add_argument("--url", help="another server's URL (plain http, with an `echo(message)` tool)")
    args = ap.parse_args()

    url = args.url
    if url is None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/mcp"

    # Its store of keys in a directory of this run's, not the user's.
    state = tempfile.TemporaryDirectory(prefix="notify-order-state-")
    env = dict(os.environ, MCP_RETRY_LOG="warn", MCP_RETRY_STATE_DIR=state.name)
    client = Client([args.proxy, "run", "--url", url], env)
    answer, *_ = client.request("initialize", {
        "protocolVersion": "2025-11-25", "capabilities": {"roots": {"listChanged": True}},
        "clientInfo": {"name": "notify_order", "version": "1"}})
    assert "result" in answer, answer
    client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    answer, *_ = client.request("tools/list", {})
    assert "echo" in [t["name"] for t in answer["result"]["tools"]], answer

    workloads = [("call", None), ("note+call", 0), ("slow note+call", args.slow_ack)]
    if args.url:  # its acknowledgements are its own
        workloads = workloads[:2]
    sent = {name: [] for name, _ in workloads}  # (tag, written, answered) per call
    per_round = max(1, args.calls // args.rounds)
    n = 0
    # Warm-up: connections in ureq's pool, the server's threads.
    for _ in range(20):
        n += 1
        client.request("tools/call", {"name": "echo", "arguments": {"message": f"warm-{n}"}})
    with arrivals_lock:
        arrivals.clear()
    for r in range(args.rounds):
        order = workloads[r % 3:] + workloads[:r % 3]
        for name, delay in order:
            for _ in range(per_round):
                n += 1
                tag = f"c{n}"
                note = None
                if delay is not None:
                    note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed",
                            "params": {"_meta": {"tag": tag, "ackDelayMs": delay}}}
                answer, written, answered = client.request(
                    "tools/call", {"name": "echo", "arguments": {"message": tag}}, before=note)
                assert tag in answer["result"]["content"][0]["text"], answer
                sent[name].append((tag, written, answered))
    client.p.stdin.close()
    client.p.wait(timeout=10)

    with arrivals_lock:
        seen = list(arrivals)
    position = {(kind, tag): i for i, (kind, tag, _) in enumerate(seen)}
    at = {(kind, tag): ns for kind, tag, ns in seen}
    notes = [tag for kind, tag, _ in seen if kind == "note"]
    out_of_order = sum(1 for tag in notes if position[("note", tag)] > position[("call", tag)])

    def ms(ns):
        return ns / 1e6

    print(f"{per_round * args.rounds} calls per workload in {args.rounds} rounds"
          f"{'' if args.url else f', slow ack {args.slow_ack:g} ms'}. Latency: from the client "
          f"writing its lines to reading the call's answer, ms")
    print()
    print("| workload | p50 | p95 | mean | p50 − call's | p95 − call's |")
    print("|---|---|---|---|---|---|")
    base = [ms(b - a) for _, a, b in sent["call"]]
    for name, _ in workloads:
        t = [ms(b - a) for _, a, b in sent[name]]
        print(f"| {name} | {percentile(t, .5):.3f} | {percentile(t, .95):.3f} | "
              f"{statistics.mean(t):.3f} | {percentile(t, .5) - percentile(base, .5):+.3f} | "
              f"{percentile(t, .95) - percentile(base, .95):+.3f} |")
    if args.url:
        t = direct_acks(args.url, per_round * args.rounds)
        print()
        print(f"The server's own 202 to a notification, posted directly (no proxy), ms: "
              f"p50 {percentile(t, .5):.3f}, p95 {percentile(t, .95):.3f}")
        return 0
    print()
    print("Where the time goes (p50 / p95, ms; the server reads a message once its body is in):")
    print()
    print("| workload | written → notification read | notification read → call read "
          "| written → call read | call read → answer read |")
    print("|---|---|---|---|---|")
    for name, delay in workloads:
        def cell(values):
            return f"{percentile(values, .5):.3f} / {percentile(values, .95):.3f}"
        rows = sent[name]
        to_call = [ms(at[("call", tag)] - a) for tag, a, _ in rows]
        back = [ms(b - at[("call", tag)]) for tag, _, b in rows]
        if delay is None:
            to_note = gap = "–"
        else:
            to_note = cell([ms(at[("note", tag)] - a) for tag, a, _ in rows])
            gap = cell([ms(at[("call", tag)] - at[("note", tag)]) for tag, _, _ in rows])
        print(f"| {name} | {to_note} | {gap} | {cell(to_call)} | {cell(back)} |")
    print()
    print(f"Notifications that reached the server after the call written after them: "
          f"{out_of_order} of {len(notes)}")
    return 1 if out_of_order else 0

if __name__ == "__main__":
    sys.exit(main())
