#!/usr/bin/env python3
"""Calls per second through `mcp-retry run --url` in front of the Python SDK server.

    http_calls.py [LABEL=]PATH/TO/mcp-retry [[LABEL=]PATH ...]
                  [--rounds R] [--calls N] [--seq-calls N] [--depth D,D]
                  [--era 2025-11-25|2026-07-28|both] [--python PY | --url URL]

Starts the interop suite's Python SDK server (tests/interop/py_http_server.py,
`mcp` on uvicorn, with `--python`, by default the suite's venv
tests/interop/.venv/bin/python, which `make interop` creates) on a free
loopback port, or uses `--url` (plain http, a server with an
`echo(message)` tool). For every binary given it starts one
`mcp-retry run --url` with no config file and drives it over stdio as an MCP
client does: the handshake of the era (`initialize` and `initialized` in
2025-11-25; none in 2026-07-28, where every request carries its version in
`_meta`), `tools/list`, then warm-up calls. Then, in each round, every
workload runs once on every binary, the binaries taking turns (which goes
first rotates with the round), so that load from elsewhere on the machine
falls on all of them alike:

* `sequential`: `--seq-calls` `tools/call`s of `echo`, one at a time: the
  next is written once the answer to the last was read;
* `pipelined D`: `--calls` of them with D in flight: D are written at
  once, then one more each time an answer is read.

Calls per second is the workload's calls over the time from its first
line written to its last answer read. Every answer is checked (its id, and
`Echo: TAG` for the call's own tag); an error or a wrong answer stops the
run (exit status 1). Beside it: the CPU time the proxy's process (all its
threads) and the server's spent per call over all rounds, from /proc (10 ms
ticks), and the load average at each round's start. Short rounds, many of
them: the binaries' runs of a workload follow each other within a few
seconds, so each round's pair sees nearly the same load.

The first binary is the baseline. For each other binary the script prints,
per workload, the ratio of its calls per second to the baseline's in each
round (paired), their median and range, in how many rounds it was the
slower, and a verdict on the median of the paired ratios: "not lower" when
it is at least 1, else "lower by X%", and when fewer rounds were slower
than a sign test needs (two-sided p < 0.05) "within the noise" is added.
Give the baseline twice (`before=A again=A`) to see the noise itself. Run it
all at the same `nice` (BENCHMARKS.md) while the machine is shared: the
script, the server and the proxies then compete alike.
"""
import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "..", "tests", "interop", "py_http_server.py")
VENV_PYTHON = os.path.join(HERE, "..", "tests", "interop", ".venv", "bin", "python")
MODERN = "2026-07-28"
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid):
    """User and system time of process `pid` and all its threads (Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return float("nan")


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(python, log_dir):
    """Starts py_http_server.py; returns the process and its URL once it listens."""
    port = free_port()
    log = open(os.path.join(log_dir, "server.log"), "wb")
    proc = subprocess.Popen([python, SERVER, str(port), os.path.join(log_dir, "executions.jsonl")],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"{SERVER} did not listen on 127.0.0.1:{port} (see {log.name})")


class Proxy:
    """One `mcp-retry run --url` and the MCP client on its stdin and stdout."""

    def __init__(self, label, path, url, era, state_dir):
        self.label, self.era = label, era
        env = dict(os.environ, MCP_RETRY_LOG="warn", MCP_RETRY_STATE_DIR=state_dir)
        self.p = subprocess.Popen([path, "run", "--url", url], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.p.stderr), daemon=True).start()
        self.next_id = 0
        self.tag = 0
        envelope = {"io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": {"name": "http_calls", "version": "1"}}
        self.meta = {"_meta": envelope} if era == MODERN else {}
        if era != MODERN:
            answer = self.request("initialize", {
                "protocolVersion": era, "capabilities": {},
                "clientInfo": {"name": "http_calls", "version": "1"}})
            self.check("result" in answer, answer)
            self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = self.request("tools/list", dict(self.meta))
        self.check("echo" in [t["name"] for t in answer.get("result", {}).get("tools", [])], answer)

    def fail(self, why):
        stderr = b"".join(self.log).decode(errors="replace")
        sys.exit(f"{self.label}: {why}\n{stderr}")

    def check(self, ok, what):
        if not ok:
            self.fail(f"unexpected answer: {what}")

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def read(self):
        line = self.p.stdout.readline()
        if not line:
            self.fail("the proxy closed its stdout")
        return json.loads(line)

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            msg = self.read()
            if msg.get("id") == self.next_id:
                return msg

    def call(self):
        """Writes one `tools/call`; returns its id and the text it must echo."""
        self.next_id += 1
        self.tag += 1
        text = f"c{self.tag}"
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                   "params": dict(self.meta, name="echo", arguments={"message": text})})
        return self.next_id, f"Echo: {text}"

    def run(self, calls, depth):
        """`calls` calls with at most `depth` in flight; returns their wall time (s)."""
        open_calls = {}
        written = 0
        start = time.perf_counter()
        while written < min(depth, calls):
            id, want = self.call()
            open_calls[id] = want
            written += 1
        answered = 0
        while answered < calls:
            msg = self.read()
            want = open_calls.pop(msg.get("id"), None)
            if want is None:
                continue  # a notification or a request of the server's
            try:
                ok = msg["result"]["content"][0]["text"] == want
            except (KeyError, IndexError, TypeError):
                ok = False
            self.check(ok, msg)
            answered += 1
            if written < calls:
                id, want = self.call()
                open_calls[id] = want
                written += 1
        return time.perf_counter() - start

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass  # it is gone already
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()


def sign_test(k, n):
    """Two-sided sign test: the chance of k or fewer (or as many or more)
    of n rounds slower when either binary is as likely to be slower."""
    tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binaries", nargs="+", metavar="[LABEL=]PATH",
                    help="mcp-retry binaries; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seq-calls", type=int, default=200, help="sequential calls per round")
    ap.add_argument("--calls", type=int, default=500, help="pipelined calls per round")
    ap.add_argument("--depth", default="16,64", help="calls in flight when pipelined (comma-separated)")
    ap.add_argument("--era", default="2025-11-25", choices=["2025-11-25", MODERN, "both"])
    ap.add_argument("--python", default=VENV_PYTHON, help="a python with the `mcp` SDK (the interop venv)")
    ap.add_argument("--url", help="use this server instead (plain http, an `echo(message)` tool)")
    ap.add_argument("--warmup", type=int, default=100, help="calls per proxy before the rounds")
    args = ap.parse_args()

    binaries = []
    for i, spec in enumerate(args.binaries):
        label, _, path = spec.partition("=") if "=" in spec else (f"#{i + 1}", "", spec)
        if not os.access(path, os.X_OK):
            sys.exit(f"not an executable: {path}")
        binaries.append((label, os.path.abspath(path)))
    if len({label for label, _ in binaries}) < len(binaries):
        sys.exit("two binaries have the same label")
    workloads = [("sequential", args.seq_calls, 1)]
    workloads += [(f"pipelined {d}", args.calls, d) for d in map(int, args.depth.split(","))]
    eras = ["2025-11-25", MODERN] if args.era == "both" else [args.era]

    tmp = tempfile.TemporaryDirectory(prefix="http-calls-")
    server = None
    url = args.url
    if url is None:
        if not os.access(args.python, os.X_OK):
            sys.exit(f"no python at {args.python}: run `make tests/interop/.venv/.installed` "
                     "or pass --python (one with the pinned `mcp`) or --url")
        server, url = start_server(args.python, tmp.name)

    proxies = {}  # (era, label) -> Proxy
    try:
        for era in eras:
            for label, path in binaries:
                state = tempfile.mkdtemp(prefix="state-", dir=tmp.name)
                p = proxies[(era, label)] = Proxy(label, path, url, era, state)
                # Warm-up: ureq's pool, the server's session and its threads.
                p.run(args.warmup, 1)
                p.run(args.warmup * 4, max(d for _, _, d in workloads))

        # (era, workload, label) -> per round: calls/s, the proxy's and the server's CPU seconds
        results = {}
        loads = []
        print(f"{args.rounds} rounds; per round and binary: {args.seq_calls} sequential calls, "
              f"{args.calls} per pipelined workload; server {url}"
              f"{'' if server is None else ' (py_http_server.py, pid %d)' % server.pid}", flush=True)
        for r in range(args.rounds):
            loads.append(load_average())
            order = binaries[r % len(binaries):] + binaries[:r % len(binaries)]
            line = []
            for era in eras:
                for name, calls, depth in workloads:
                    for label, _ in order:
                        p = proxies[(era, label)]
                        cpu0 = cpu_seconds(p.p.pid)
                        srv0 = cpu_seconds(server.pid) if server else float("nan")
                        wall = p.run(calls, depth)
                        cpu = cpu_seconds(p.p.pid) - cpu0
                        srv = (cpu_seconds(server.pid) - srv0) if server else float("nan")
                        results.setdefault((era, name, label), []).append((calls / wall, cpu, srv))
                        line.append(f"{label} {name[:3]}{'' if depth == 1 else depth} {calls / wall:.0f}")
            print(f"round {r + 1} (load {loads[-1]:.2f}): " + ", ".join(line), flush=True)
        loads.append(load_average())
    finally:  # also when a proxy failed: no server or proxy is left behind
        for p in proxies.values():
            p.close()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)

    base = binaries[0][0]
    print()
    print(f"Load average (1 min) at each round's start and at the end: "
          f"{min(loads):.2f}–{max(loads):.2f} (median {statistics.median(loads):.2f}).")
    verdicts = []
    for era in eras:
        print()
        print(f"Era {era}. Calls per second over {args.rounds} rounds; each binary's against the "
              f"baseline's ({base}) of the same round; CPU per call (µs) over all rounds.")
        print()
        print("| workload | binary | calls/s median | min–max | × baseline, paired: median (min–max) "
              "| rounds slower | sign test p | proxy CPU µs/call | server CPU µs/call |")
        print("|---|---|--:|--:|--:|--:|--:|--:|--:|")
        for name, calls, _ in workloads:
            b = [x[0] for x in results[(era, name, base)]]
            for label, _ in binaries:
                rows = results[(era, name, label)]
                rate = [x[0] for x in rows]
                ratio = slower = p = "–"
                if label != base:
                    pairs = [a / c for a, c in zip(rate, b)]
                    m = statistics.median(pairs)
                    k = sum(1 for x in pairs if x < 1)
                    pv = sign_test(k, len(pairs))
                    ratio = f"{m:.3f} ({min(pairs):.3f}–{max(pairs):.3f})"
                    slower, p = f"{k} of {len(pairs)}", f"{pv:.2f}"
                    if m >= 1:
                        verdict = "not lower"
                    else:
                        verdict = f"lower by {100 * (1 - m):.1f}%"
                        if k <= len(pairs) / 2 or pv >= 0.05:
                            verdict += " (within the noise)"
                    verdicts.append(f"{era} {name}, {label} against {base}: {verdict}: paired ratio "
                                    f"{m:.3f}, slower in {k} of {len(pairs)} rounds; medians "
                                    f"{statistics.median(rate):.0f} and {statistics.median(b):.0f} calls/s")
                total = calls * len(rows)
                print(f"| {name} | {label} | {statistics.median(rate):.0f} | {min(rate):.0f}–{max(rate):.0f} "
                      f"| {ratio} | {slower} | {p} | {1e6 * sum(x[1] for x in rows) / total:.0f} "
                      f"| {1e6 * sum(x[2] for x in rows) / total:.0f} |")
    if verdicts:
        print()
        for v in verdicts:
            print("- " + v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
