#!/usr/bin/env python3
"""Drives mcp-retry in front of a server that fails on request, and prints
what happened: a retry, a dedup hit, a cache hit and the circuit breaker.

Usage: demo.py PATH/TO/mcp-retry PATH/TO/mock-mcp-server
"""
import json
import os
import subprocess
import sys
import tempfile
import threading

proxy, mock = sys.argv[1], sys.argv[2]
here = os.path.dirname(os.path.abspath(__file__))
state = tempfile.mkdtemp(prefix="mcp-retry-demo-")
exec_log = os.path.join(state, "executions.log")
# The store of idempotency keys in the demo's own directory: each demo
# starts afresh, and the user's state directory is left alone.
env = dict(os.environ, MOCK_SERVER=os.path.abspath(mock), MOCK_LOG=exec_log,
           MOCK_STATE_DIR=state, MCP_RETRY_LOG="info",
           MCP_RETRY_STATE_DIR=os.path.join(state, "store"),
           MCP_RETRY_RUNTIME_DIR=os.path.join(state, "runtime"))
env.pop("MCP_RETRY_STORE", None)

p = subprocess.Popen([proxy, "run", "--config", os.path.join(here, "demo.yaml")],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     env=env, text=True, bufsize=1)
log_lines = []
threading.Thread(target=lambda: log_lines.extend(p.stderr), daemon=True).start()
next_id = 0


def request(method, params):
    global next_id
    next_id += 1
    p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}) + "\n")
    p.stdin.flush()
    while True:
        msg = json.loads(p.stdout.readline())
        if msg.get("id") == next_id:
            return msg


def call(tool, **arguments):
    return request("tools/call", {"name": tool, "arguments": arguments})


def executions(tool):
    try:
        with open(exec_log) as f:
            return sum(1 for line in f if json.loads(line)["tool"] == tool)
    except FileNotFoundError:
        return 0


def outcome(msg):
    if "error" in msg:
        e = msg["error"]
        reason = (e.get("data") or {}).get("reason")
        return f"error {e['code']}" + (f" ({reason})" if reason else "") + f": {e['message']}"
    r = msg["result"]
    source = (r.get("_meta") or {}).get("mcp-retry/source")
    return "result" + (f" served from {source}" if source else " from the server")


def show(title, msg, tool):
    print(f"\n== {title}")
    print(f"   client got: {outcome(msg)}")
    print(f"   the server executed {tool} {executions(tool)} time(s)")


request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "demo", "version": "1"}})
p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
p.stdin.flush()

print("mcp-retry demo: a client talks to a flaky MCP server through mcp-retry")

show("1. retry: idem_echo (annotated idempotent) fails twice with -32000, then works",
     call("idem_echo", mode="flaky", fail_times=2, text="hello"), "idem_echo")

def keyed_call(tool, key, **arguments):
    return request("tools/call", {"name": tool, "arguments": arguments,
                                  "_meta": {"idempotencyKey": key}})


first = keyed_call("unsafe_echo", "invoice-42", text="send the invoice")
second = keyed_call("unsafe_echo", "invoice-42", text="send the invoice")
show("2. dedup: a side-effecting call sent twice with one idempotency key (first: "
     + outcome(first) + ")", second, "unsafe_echo")

call("ro_echo", text="look something up")
show("3. cache: a read-only lookup asked twice (ro_echo is cached for 30 s)",
     call("ro_echo", text="look something up"), "ro_echo")

print("\n== 4. circuit breaker: the server keeps failing (threshold 3)")
for i in range(3):
    m = call("echo", mode="error", code=-32000, message=f"backend down ({i + 1})")
    print(f"   call {i + 1}: {outcome(m)}")
before = executions("echo")
m = call("echo", text="are you back?")
print(f"   call 4: {outcome(m)}")
print(f"   the server executed echo {executions('echo') - before} more time(s): the breaker answered at once")

p.stdin.close()
p.wait(timeout=10)
print("\n== what mcp-retry logged (stderr)")
for line in log_lines:
    if line.startswith("mcp-retry:"):
        print("   " + line.rstrip())
