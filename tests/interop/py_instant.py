"""The interop suite's instant start group: the official Python SDK client
drives `mcp-retry run --config` with `instant_start: true` in front of
server-everything and server-filesystem, each started through `npx -y` with
an empty npm cache (a real slow start: npx fetches the package and its
dependencies from the registry).

    py_instant.py PROXY RUN_DIR OUT_JSON 2>RUN_DIR/stderr.log

Per server, two sessions with the same config, the same handshake cache
directory (MCP_RETRY_CACHE_DIR) and the same, emptied, npm cache:

1. the first fills the handshake cache: the client connects in the
   initialize era, lists the tools and calls one; the script waits until the
   entry holds the tool list (the proxy stores it once it has read the
   server's lists);
2. the second begins from the cache: the client's `initialize` and
   `list_tools` must complete in under 1.5 s (timed here, from launching the
   proxy to the tool list: the server's 1 s grace to answer `initialize`
   itself, then the cache's answer), with the tool list of the first session, while
   npx is still fetching the server; then a tool call waits for the real
   server and works, once.

Writes `{"checks": [{"name", "ok", "detail"}...]}` to OUT_JSON for run.py,
which prints them as its other checks. Its stderr, which mcp-retry inherits,
must go to RUN_DIR/stderr.log (run.py sends it there): checks read
mcp-retry's log.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from py_client import dump
from run import HERE

# The instant answer's budget, from launching the proxy to the tool list:
# the grace in which the server may answer `initialize` itself (1 s), then
# the cached answer, with room for a loaded machine.
INSTANT_BUDGET = 1.500
# How long a session may take to start its server through npx on a cold
# cache, and the first session to store its entry.
SLOW_START = 180
LOG_FROM_CACHE = "answered initialize from the handshake cache"
LOG_READY = "the session began from the handshake cache"


def pinned(package: str) -> str:
    """`package@version` as package.json pins it, so npx fetches the version
    the rest of the suite runs."""
    with open(os.path.join(HERE, "package.json"), encoding="utf-8") as f:
        return f"{package}@{json.load(f)['dependencies'][package]}"


class Group:
    def __init__(self, proxy: str, run_dir: str) -> None:
        self.proxy = proxy
        self.run_dir = run_dir
        self.cache = os.path.join(run_dir, "handshake-cache")
        self.npm_cache = os.path.join(run_dir, "npm-cache")
        self.root = os.path.join(run_dir, "root")
        os.makedirs(self.root)
        with open(os.path.join(self.root, "hello.txt"), "w", encoding="utf-8") as f:
            f.write("hello from the interop suite\n")
        self.config = os.path.join(run_dir, "mcp-retry.yaml")
        everything = pinned("@modelcontextprotocol/server-everything")
        filesystem = pinned("@modelcontextprotocol/server-filesystem")
        with open(self.config, "w", encoding="utf-8") as f:
            f.write(
                "defaults:\n  instant_start: true\nservers:\n"
                f"  everything:\n    command: npx\n    args: [-y, {json.dumps(everything)}, stdio]\n"
                f"  filesystem:\n    command: npx\n    args: [-y, {json.dumps(filesystem)}, {json.dumps(self.root)}]\n"
            )
        self.log = os.path.join(run_dir, "stderr.log")
        self.checks: list[dict[str, Any]] = []

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": "" if ok else detail})

    def log_text(self) -> str:
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def entries(self) -> list[dict[str, Any]]:
        """The entries' contents (each file is `{"format", "entry"}`)."""
        out = []
        if not os.path.isdir(self.cache):
            return out
        for name in os.listdir(self.cache):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(self.cache, name), encoding="utf-8") as f:
                        out.append(json.load(f)["entry"])
                except (OSError, ValueError, KeyError):
                    pass  # being replaced: read again on the next poll
        return out

    async def session(self, server: str, tool: str, arguments: dict[str, Any], store: bool) -> dict[str, Any]:
        """One session through the proxy with an empty npm cache: the timings
        and what the client got. With `store`, it stays open until the
        handshake cache holds the server's tool list."""
        shutil.rmtree(self.npm_cache, ignore_errors=True)
        env = dict(
            os.environ,
            MCP_RETRY_CACHE_DIR=self.cache,
            MCP_RETRY_LOG="info",
            npm_config_cache=self.npm_cache,
            npm_config_update_notifier="false",
            npm_config_fund="false",
            npm_config_audit="false",
        )
        params = StdioServerParameters(
            command=self.proxy, args=["run", "--config", self.config, "--server", server], env=env, cwd=self.run_dir
        )
        out: dict[str, Any] = {}
        client = Client(params, mode="legacy", cache=None, read_timeout_seconds=SLOW_START)
        t0 = time.perf_counter()
        async with client as c:
            out["initialized"] = time.perf_counter() - t0
            out["initialize"] = dump(c.session.initialize_result)
            tools = await c.list_tools()
            out["listed"] = time.perf_counter() - t0
            out["tools"] = dump(tools.tools)
            t1 = time.perf_counter()
            try:
                result = await c.call_tool(tool, arguments)
                out["call"] = dump(result)
            except MCPError as e:
                out["call"] = {"error": dump(e.error)}
            out["called"] = time.perf_counter() - t1
            if store:
                # The proxy stores the entry once it has read the server's
                # lists (the client's own, or its own requests for them).
                deadline = time.monotonic() + SLOW_START
                while not self.entries_with_tools() and time.monotonic() < deadline:
                    await anyio.sleep(0.1)
        return out

    def entries_with_tools(self) -> bool:
        return any(e.get("tools") for e in self.entries())

    async def server(self, server: str, tool: str, arguments: dict[str, Any], answer_has: str) -> None:
        shutil.rmtree(self.cache, ignore_errors=True)
        label = f"{server} through npx"
        first = await self.session(server, tool, arguments, store=True)
        entries = self.entries()
        self.check(f"{label}: the first session stored the handshake cache entry",
                   len(entries) == 1 and entries[0].get("tools"), f"entries: {json.dumps(entries)[:2000]}")
        self.check(f"{label}: the first session's call worked",
                   answer_has in json.dumps(first["call"]), f"call: {json.dumps(first['call'])[:2000]}")
        log_before = len(self.log_text())
        second = await self.session(server, tool, arguments, store=False)
        log = self.log_text()[log_before:]
        listed = second["listed"]
        self.check(
            f"{label}: the second session's initialize + list_tools took under {INSTANT_BUDGET * 1000:.0f} ms "
            f"(from launching mcp-retry; the first session's took {first['listed']:.1f} s)",
            listed < INSTANT_BUDGET, f"took {listed * 1000:.1f} ms (initialize {second['initialized'] * 1000:.1f} ms)")
        print(f"py_instant: {server}: first session {first['listed']:.2f} s to the tool list; second "
              f"{listed * 1000:.1f} ms (initialize {second['initialized'] * 1000:.1f} ms), its call waited "
              f"{second['called']:.2f} s for the server", file=sys.stderr, flush=True)
        self.check(f"{label}: the second session's initialize was answered from the handshake cache",
                   LOG_FROM_CACHE in log, f"mcp-retry's log of the session:\n{log[-3000:]}")
        self.check(f"{label}: the second session got the first session's tool list",
                   second["tools"] == first["tools"] and len(first["tools"]) > 0,
                   f"first: {json.dumps(first['tools'])[:1500]}\nsecond: {json.dumps(second['tools'])[:1500]}")
        caps = (second["initialize"] or {}).get("capabilities", {})
        self.check(f"{label}: the cached initialize result tells the client tools.listChanged",
                   caps.get("tools", {}).get("listChanged") is True, f"capabilities: {json.dumps(caps)}")
        self.check(f"{label}: the second session's call waited for the real server and worked",
                   answer_has in json.dumps(second["call"]) and second["call"] == first["call"],
                   f"first: {json.dumps(first['call'])[:1500]}\nsecond: {json.dumps(second['call'])[:1500]}")
        self.check(f"{label}: mcp-retry logged that the real server became ready", LOG_READY in log,
                   f"mcp-retry's log of the session:\n{log[-3000:]}")
        bad = [l for l in log.splitlines() if l.startswith(("mcp-retry: warn", "mcp-retry: error"))]
        self.check(f"{label}: mcp-retry logged no warning or error in the second session", not bad,
                   "\n".join(bad[:10]))


async def main() -> None:
    proxy, run_dir, out = sys.argv[1], sys.argv[2], sys.argv[3]
    group = Group(proxy, run_dir)
    try:
        await group.server("everything", "echo", {"message": "instant start"}, "instant start")
        await group.server("filesystem", "list_allowed_directories", {}, os.path.basename(group.root))
    except Exception:  # a failure the checks did not expect: report it as one
        group.check("the instant start sessions ran to the end", False, traceback.format_exc())
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"checks": group.checks}, f, indent=1)


if __name__ == "__main__":
    anyio.run(main)
