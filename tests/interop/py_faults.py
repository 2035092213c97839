"""The interop suite's network faults: the Python SDK stdio client drives
`mcp-retry run --config` in front of the Python SDK server over Streamable
HTTP (py_http_server.py, with an event store, the initialize era), with the
fault proxy (fault_proxy.py) between them, and the server's execution log
says what really ran.

    py_faults.py PROXY RUN_DIR OUT_JSON 2>RUN_DIR/stderr.log

Starts the server and the fault proxy on free 127.0.0.1 ports, once for the
whole group; arms one fault at a time through the proxy's `/_fault` path
before each call; restarts the server on its port once; then restarts
server-everything's Streamable HTTP transport under `mcp-retry run --url`
(its answer to a forgotten session is a 400, not a 404); stops everything
it started. Writes `{"checks": [{"name", "ok", "detail"}...]}` to OUT_JSON
for run.py, which prints them as its other checks. Its stderr, which
mcp-retry inherits, must go to RUN_DIR/stderr.log (run.py sends it there):
one check reads mcp-retry's log.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import socket
import time
import traceback
import urllib.request
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from py_client import dump
from run import HERE, PYTHON, free_port, npm_server, read_jsonl, start_listening

# Seconds to wait for a notification to reach the client.
NOTIFICATION_WAIT = 10


class Faults:
    def __init__(self, proxy: str, run_dir: str) -> None:
        self.proxy = proxy
        self.run_dir = run_dir
        self.port = free_port()
        self.front = free_port()
        self.exec_log = os.path.join(run_dir, "executions.jsonl")
        self.fault_log = os.path.join(run_dir, "fault-proxy.jsonl")
        self.server: subprocess.Popen | None = None
        self.fault_proxy: subprocess.Popen | None = None
        self.checks: list[dict[str, Any]] = []
        self.notified: list[str] = []  # uris of resources/updated, in order
        self.restarts = 0
        self.everything: subprocess.Popen | None = None  # server-everything's streamableHttp
        self.everything_port = free_port()

    # ------------------------------------------------------------ processes

    def start_server(self) -> None:
        command = [PYTHON, os.path.join(HERE, "py_http_server.py"), str(self.port), self.exec_log, "--event-store"]
        self.server = start_listening(command, self.port, self.run_dir, f"http-server-{self.restarts}.log")

    def start(self) -> None:
        self.start_server()
        command = [PYTHON, os.path.join(HERE, "fault_proxy.py"), str(self.front), str(self.port), self.fault_log]
        self.fault_proxy = start_listening(command, self.front, self.run_dir, "fault-proxy.log")

    def stop(self) -> None:
        for proc in (self.server, self.fault_proxy, self.everything):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def start_everything(self) -> None:
        """(Again:) server-everything's Streamable HTTP transport on its
        port, after killing the one that ran there."""
        if self.everything is not None:
            self.everything.kill()
            self.everything.wait(10)
        command = ["node", "--require", os.path.join(HERE, "loopback.cjs")] + npm_server("server-everything")[1:]
        self.everything = start_listening(command + ["streamableHttp"], self.everything_port, self.run_dir,
                                          f"everything-{self.restarts}.log", {"PORT": str(self.everything_port)})

    def restart_server(self) -> None:
        """Kills the server (no goodbye to anyone) and starts it again on
        the same port: every session it had is gone."""
        assert self.server is not None
        self.server.kill()
        self.server.wait(10)
        self.restarts += 1
        self.start_server()

    # --------------------------------------------------------------- faults

    def arm(self, fault: dict[str, Any]) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.front}/_fault", data=json.dumps(fault).encode(),
                                     method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stderr(self) -> str:
        """What was written to RUN_DIR/stderr.log (mcp-retry's log)."""
        path = os.path.join(self.run_dir, "stderr.log")
        return open(path, encoding="utf-8").read() if os.path.exists(path) else ""

    def wait_listening(self) -> None:
        """Until the fault proxy's port is open again after a refusal."""
        deadline = time.monotonic() + NOTIFICATION_WAIT
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.front), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)

    def executions(self, tool: str, arguments: dict[str, Any]) -> int:
        return sum(1 for e in read_jsonl(self.exec_log) if e == {"tool": tool, "arguments": arguments})

    def requests(self, rpc_method: str) -> int:
        return sum(1 for r in read_jsonl(self.fault_log) if r["rpc_method"] == rpc_method)

    def check(self, name: str, ok: bool, detail: Any = "") -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": "" if ok else str(detail)[:2000]})

    # -------------------------------------------------------------- clients

    async def message(self, message: Any) -> None:
        message = getattr(message, "root", message)
        if isinstance(message, types.ResourceUpdatedNotification):
            self.notified.append(str(message.params.uri))

    async def wait_notified(self, uri: str) -> bool:
        deadline = time.monotonic() + NOTIFICATION_WAIT
        while uri not in self.notified and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        return uri in self.notified

    @staticmethod
    async def call(c: Client, tool: str, arguments: dict[str, Any], on_progress: Any = None) -> dict[str, Any]:
        """The tool's result as wire JSON, or {"error": ...}."""
        try:
            return dump(await c.call_tool(tool, arguments, progress_callback=on_progress))
        except MCPError as e:
            return {"error": dump(e.error)}

    async def direct(self, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """The answers of the server to `calls`, without mcp-retry."""
        async with Client(f"http://127.0.0.1:{self.port}/mcp", mode="legacy", cache=None) as c:
            return [await self.call(c, tool, args) for tool, args in calls]

    async def run(self) -> None:
        same = [("echo", {"message": "reset"}), ("echo", {"message": "502"}), ("echo", {"message": "503"})]
        direct = dict(zip((a["message"] for _t, a in same), await self.direct(same)))
        config = os.path.join(self.run_dir, "mcp-retry.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f"servers:\n  remote:\n    url: http://127.0.0.1:{self.front}/mcp\n    call_timeout: 20\n"
                    "    retry:\n      base_delay: 0.1\n      max_delay: 0.5\n      jitter: 0\n")
        # The session's GET stream is cut right after it carried the first
        # announcement: mcp-retry opens it again, and no announcement may
        # reach the client twice (nor be lost).
        self.arm({"mode": "cut", "get": True, "after": "interop://announced/one"})
        params = StdioServerParameters(command=self.proxy, args=["run", "--config", config], env=dict(os.environ))
        async with Client(params, mode="legacy", cache=None, message_handler=self.message,
                          read_timeout_seconds=30) as c:
            await self.get_stream(c, ["one", "two"], cut=True)
            await self.unsafe_and_safe(c, direct)
            await self.waits(c)
            await self.session_lost(c)
            # A restart of the server on its port: the next call meets 404
            # for the old session, mcp-retry opens a new one and resends.
            initializes = self.requests("initialize")
            await anyio.to_thread.run_sync(self.restart_server)
            got = await self.call(c, "append", {"note": "restart"})
            self.check("a server restarted on its port is invisible: the call answered, ran once",
                       got.get("error") is None and self.executions("append", {"note": "restart"}) == 1
                       and self.requests("initialize") == initializes + 1, got)
            await self.get_stream(c, ["three"], cut=False)
        await self.everything_restart()

    async def everything_restart(self) -> None:
        """server-everything forgets its sessions when it restarts and then
        answers "400 Bad Request: No valid session ID provided" (not 404):
        mcp-retry must start a new session all the same."""
        await anyio.to_thread.run_sync(self.start_everything)
        url = f"http://127.0.0.1:{self.everything_port}/mcp"
        params = StdioServerParameters(command=self.proxy, args=["run", "--url", url], env=dict(os.environ))
        async with Client(params, mode="legacy", cache=None, read_timeout_seconds=30) as c:
            before = await self.call(c, "echo", {"message": "before the restart"})
            self.restarts += 1
            await anyio.to_thread.run_sync(self.start_everything)
            after = await self.call(c, "echo", {"message": "after the restart"})
        want = [{"content": [{"type": "text", "text": f"Echo: {m} the restart"}]} for m in ("before", "after")]
        self.check("server-everything restarted on its port (400 for the old session) is invisible to the client",
                   [before, after] == want and "400 Bad Request" in self.stderr(), [before, after])

    async def wait_gets(self, n: int) -> None:
        """Until the fault proxy has seen `n` GETs since the last session
        began (at most NOTIFICATION_WAIT)."""
        deadline = time.monotonic() + NOTIFICATION_WAIT
        while time.monotonic() < deadline:
            log = read_jsonl(self.fault_log)
            start = max((i for i, r in enumerate(log) if r["rpc_method"] == "initialize"), default=0)
            if sum(r["method"] == "GET" for r in log[start:]) >= n:
                return
            await anyio.sleep(0.05)

    async def stream_ready(self, c: Client, prefix: str) -> bool:
        """Announces PREFIX-1, PREFIX-2, ... until one reaches the client:
        the server drops what it sends while no GET stream of the session
        is open (the spec lets it), and the proxy's log of the GET does not
        say when the server has taken it."""
        await self.wait_gets(1)
        for i in range(1, 21):
            uri = f"interop://announced/{prefix}-{i}"
            await self.call(c, "announce", {"topic": f"{prefix}-{i}"})
            deadline = time.monotonic() + 0.5
            while uri not in self.notified and time.monotonic() < deadline:
                await anyio.sleep(0.02)
            if uri in self.notified:
                return True
        return False

    async def get_stream(self, c: Client, topics: list[str], cut: bool) -> None:
        when = "after its GET stream was cut and opened again" if cut else "on the new session's GET stream"
        ready = False
        for n, topic in enumerate(topics):
            if n == 0 or cut:
                if cut and n > 0:
                    await self.wait_gets(2)  # mcp-retry opened it again
                ready = await self.stream_ready(c, f"before-{topic}")
            uri = f"interop://announced/{topic}"
            got = await self.call(c, "announce", {"topic": topic})
            arrived = await self.wait_notified(uri)
            await anyio.sleep(0.5)  # room for a duplicate to arrive
            gets = [r for r in read_jsonl(self.fault_log) if r["method"] == "GET"]
            self.check(f"the server's notification {topic!r} reached the client once ({when})",
                       ready and got.get("error") is None and arrived and self.notified.count(uri) == 1,
                       {"stream ready": ready, "answer": got, "notified": self.notified, "gets": gets})
        twice = sorted({u for u in self.notified if self.notified.count(u) > 1})
        self.check(f"no notification of the GET stream reached the client twice ({when})", not twice, twice)
        if cut:
            gets = [r for r in read_jsonl(self.fault_log) if r["method"] == "GET"]
            self.check("the fault proxy cut the GET stream; mcp-retry opened it again with Last-Event-ID "
                       "(the event store replays what follows it)",
                       len(gets) >= 2 and gets[0]["fault"] == "cut" and gets[1]["last_event_id"] is not None, gets)

    async def unsafe_and_safe(self, c: Client, direct: dict[str, dict[str, Any]]) -> None:
        # Reset after the request was forwarded (and the tool ran).
        self.arm({"mode": "reset", "match": '"append"|"reset"'})
        got = await self.call(c, "append", {"note": "reset"})
        outcome = (got.get("error") or {}).get("data", {}).get("outcome")
        self.check("an unsafe tool facing a reset ran once and got outcome: unknown",
                   outcome == "unknown" and self.executions("append", {"note": "reset"}) == 1, got)
        self.arm({"mode": "reset", "match": '"echo"|"reset"'})
        got = await self.call(c, "echo", {"message": "reset"})
        self.check("a read-only tool facing a reset was retried and answered as directly",
                   got == direct["reset"] and self.executions("echo", {"message": "reset"}) == 1 + 2, got)
        # The call's stream cut after its third event (the event store's
        # priming event and two progress events): resumed, not run again.
        self.arm({"mode": "cut", "events": 3, "match": '"count"|"delay":0.2'})
        progress: list[float] = []

        async def on_progress(p: float, _total: float | None, _message: str | None) -> None:
            progress.append(p)

        got = await self.call(c, "count", {"steps": 3, "delay": 0.2}, on_progress)
        resumed = [r for r in read_jsonl(self.fault_log) if r["method"] == "GET" and r["last_event_id"]]
        self.check("a call whose stream was cut after 3 events was resumed (GET, Last-Event-ID), ran once, "
                   "and each progress notification arrived once",
                   got.get("error") is None and self.executions("count", {"steps": 3, "delay": 0.2}) == 1
                   and resumed and progress == [1, 2, 3],
                   {"answer": got, "progress": progress, "requests": read_jsonl(self.fault_log)})
        # 502 and 503 without Retry-After (and 502 with one) may have run:
        # the gate lets only the safe tool be sent again.
        for status, retry_after, note in [(502, None, "502"), (503, None, "503"), (502, "1", "502-ra")]:
            self.arm({"mode": "status", "status": status, "retry_after": retry_after, "match": f'"append"|"{note}"'})
            got = await self.call(c, "append", {"note": note})
            outcome = (got.get("error") or {}).get("data", {}).get("outcome")
            self.check(f"{status}{' with Retry-After' if retry_after else ''}: an unsafe tool is not sent again "
                       "(outcome: unknown, never ran)",
                       outcome == "unknown" and self.executions("append", {"note": note}) == 0, got)
            if note in direct:
                self.arm({"mode": "status", "status": status, "retry_after": None, "match": f'"echo"|"{note}"'})
                got = await self.call(c, "echo", {"message": note})
                self.check(f"{status}: a read-only tool is sent again and answered as directly",
                           got == direct[note] and self.executions("echo", {"message": note}) == 2, got)

    async def waits(self, c: Client) -> None:
        # Refusals that say the request did not run: retried for any tool.
        for status, retry_after, note in [(429, "1", "429"), (429, None, "429-bare"), (503, "1", "503-ra")]:
            self.arm({"mode": "status", "status": status, "retry_after": retry_after, "match": f'"append"|"{note}"'})
            got = await self.call(c, "append", {"note": note})
            self.check(f"{status}{' with Retry-After' if retry_after else ' without Retry-After'}: "
                       "an unsafe tool was sent again and ran once",
                       got.get("error") is None and self.executions("append", {"note": note}) == 1, got)
        # Answer headers that come late (within the call's timeout).
        self.arm({"mode": "delay", "seconds": 1.5, "match": '"append"|"delay"'})
        got = await self.call(c, "append", {"note": "delay"})
        self.check("delayed answer headers: the call answered, ran once",
                   got.get("error") is None and self.executions("append", {"note": "delay"}) == 1, got)
        # The port closed for a moment: never sent, so sent again. (Shorter
        # than the restart backoff's second step, 0.5 s: a server refusing
        # for longer than a second is answered server_unavailable at once,
        # as documented.)
        await anyio.to_thread.run_sync(self.arm, {"mode": "refuse", "seconds": 0.3})
        got = await self.call(c, "append", {"note": "refused"})
        self.check("a refused connection: the unsafe call was sent again and ran once",
                   got.get("error") is None and self.executions("append", {"note": "refused"}) == 1
                   and "could not be reached" in self.stderr(), got)
        await anyio.to_thread.run_sync(self.wait_listening)

    async def session_lost(self, c: Client) -> None:
        initializes = self.requests("initialize")
        self.arm({"mode": "status", "status": 404, "match": '"append"|"404"'})
        got = await self.call(c, "append", {"note": "404"})
        lost = [r for r in read_jsonl(self.fault_log) if r["fault"] == "status 404"]
        self.check("404 for the session: re-initialized transparently, the call resent once and ran once",
                   got.get("error") is None and self.executions("append", {"note": "404"}) == 1
                   and self.requests("initialize") == initializes + 1 and lost, got)


def main() -> int:
    proxy, run_dir, out = sys.argv[1:4]
    faults = Faults(proxy, run_dir)
    try:
        faults.start()
        anyio.run(faults.run)
    except Exception as e:  # the group broke: one failed check says how
        faults.check("the fault scenarios ran to the end", False, "".join(traceback.format_exception(e)))
    finally:
        faults.stop()
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"checks": faults.checks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
