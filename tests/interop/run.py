"""mcp-retry's interop suite: real clients and real servers, direct and
through the proxy, compared.

    .venv/bin/python run.py --proxy PATH/TO/mcp-retry [--only TEXT] [--keep]

For every scenario (a client, a server, a protocol era) the same client
script runs twice against a fresh server: once launching the server directly
and once launching `mcp-retry run -- SERVER` (or, for a remote server,
`mcp-retry run --url` or `--config`). Both runs are recorded at two levels
and compared check by check:

* what the client SDK returned for every step (results, errors, progress,
  the server's requests to the client) — written by py_client.py or
  ts_client.mjs;
* the wire itself: tap.py sits in front of whatever the client launches and
  logs every line the client sent and received (and, in the proxied run, a
  second tap between mcp-retry and the server logs what the server got).

Results must be identical except for what the normalizers below remove, each
for a stated reason. One group is different: py_faults.py puts network faults
between mcp-retry and the Python SDK server over Streamable HTTP and judges
each step by the server's execution log (see fault_checks). The official
conformance tool's client scenarios are another: the tool's own test server
judges conformance_client.mjs, directly and through `mcp-retry run --url`
(see conformance_checks). py_instant.py's group hides a slow start (npx on an
empty npm cache) behind instant_start and times the second session's
handshake (see instant_checks). The report is one PASS/FAIL line per check and ends with
`N passed, M failed`; the exit status is 1 when anything failed.
"""
from __future__ import annotations

import argparse
import base64
import difflib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
NODE_MODULES = os.path.join(HERE, "node_modules")
PYTHON = sys.executable  # the suite's venv, which has the pinned `mcp`
RUN_TIMEOUT = 120  # seconds for one client run; a normal run takes a few


def npm_server(package: str) -> list[str]:
    return ["node", os.path.join(NODE_MODULES, "@modelcontextprotocol", package, "dist", "index.js")]


@dataclass
class Scenario:
    client: str  # "python" or "typescript"
    script: str  # the scenario name the client script knows
    mode: str  # python: "auto" or "legacy"; typescript: "legacy" (SDK 1.x)
    server: str  # for the report
    command: Callable[[str], list[str]]  # run dir -> server command
    env: Callable[[str], dict[str, str]] = lambda _run: {}
    # Proxied run only: this command serves Streamable HTTP on $PORT (on
    # 127.0.0.1) and mcp-retry reaches it with --url.
    http: Callable[[str], list[str]] | None = None
    # The Python SDK server over Streamable HTTP (py_http_server.py), with an
    # event store (True) or without (False). Both runs start it on a free
    # port: the direct run's client connects to it with the SDK's own
    # Streamable HTTP client; the proxied run's launches `mcp-retry run
    # --config` naming a fault proxy (fault_proxy.py) in front of it, which
    # cuts the stream of one call (CUT_CALL).
    py_http: bool | None = None

    @property
    def label(self) -> str:
        era = {"auto": "server/discover, else initialize", "legacy": "initialize"}[self.mode]
        sdk = "python-sdk" if self.client == "python" else "typescript-sdk"
        if self.py_http is not None:
            store = "with an event store" if self.py_http else "without an event store"
            return f"{sdk} [{era}] x {self.server} over Streamable HTTP, {store}"
        via = " over Streamable HTTP" if self.http else ""
        return f"{sdk} [{era}] x {self.server}{via}"


def scenarios() -> list[Scenario]:
    everything = lambda _run: npm_server("server-everything") + ["stdio"]
    filesystem = lambda run: npm_server("server-filesystem") + [os.path.join(run, "root")]
    memory = lambda _run: npm_server("server-memory")
    memory_env = lambda run: {"MEMORY_FILE_PATH": os.path.join(run, "memory.jsonl")}
    python_server = lambda _run: [PYTHON, os.path.join(HERE, "py_server.py")]
    out = []
    # The Python SDK 2.x connects in mode "auto": it probes server/discover
    # and falls back to initialize when the server does not know it (the
    # TypeScript-SDK reference servers), or adopts the 2026-07-28 era when
    # the server answers it (the Python SDK server).
    for script, server, command, env in [
        ("everything", "server-everything", everything, lambda _run: {}),
        ("filesystem", "server-filesystem", filesystem, lambda _run: {}),
        ("memory", "server-memory", memory, memory_env),
        ("python-server", "python-sdk server", python_server, lambda _run: {}),
    ]:
        out.append(Scenario("python", script, "auto", server, command, env))
    # The same Python SDK server in the initialize era.
    out.append(Scenario("python", "python-server", "legacy", "python-sdk server", python_server))
    # The TypeScript SDK 1.x client speaks only the initialize era.
    for script, server, command, env in [
        ("everything", "server-everything", everything, lambda _run: {}),
        ("filesystem", "server-filesystem", filesystem, lambda _run: {}),
        ("memory", "server-memory", memory, memory_env),
        ("python-server", "python-sdk server", python_server, lambda _run: {}),
    ]:
        out.append(Scenario("typescript", script, "legacy", server, command, env))
    # A remote server: server-everything's Streamable HTTP transport behind
    # `mcp-retry run --url`, compared with its stdio transport run directly.
    # loopback.cjs makes it listen on 127.0.0.1 only.
    everything_http = lambda _run: ["node", "--require", os.path.join(HERE, "loopback.cjs")] + npm_server(
        "server-everything"
    )[1:] + ["streamableHttp"]
    out.append(Scenario("typescript", "everything", "legacy", "server-everything", everything, http=everything_http))
    # The Python SDK client against the Python SDK server over Streamable
    # HTTP, in both eras ("auto" adopts 2026-07-28: the server answers
    # server/discover), with and without an event store.
    for mode in ("legacy", "auto"):
        for store in (True, False):
            out.append(Scenario("python", "python-http", mode, "python-sdk server", lambda _run: [], py_http=store))
    return out


# The call whose stream the fault proxy cuts after its first progress event
# (py_client.py's CUT_ARGUMENTS): `|`-separated parts of its request body.
CUT_CALL = '"count"|"delay":0.25'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_env(run_dir: str, **extra: str) -> dict[str, str]:
    """This process's environment for a run in `run_dir`: every mcp-retry
    started there keeps its state (the store of idempotency keys, the
    status documents) inside it, never in the user's directories."""
    env = dict(os.environ, MCP_RETRY_STATE_DIR=os.path.join(run_dir, "state"),
               MCP_RETRY_RUNTIME_DIR=os.path.join(run_dir, "runtime"), **extra)
    env.pop("MCP_RETRY_STORE", None)
    return env


def start_listening(command: list[str], port: int, run_dir: str, log_name: str,
                    env: dict[str, str] | None = None) -> subprocess.Popen:
    """Starts a server that listens on 127.0.0.1:`port`; returns it once it
    accepts connections."""
    log = open(os.path.join(run_dir, log_name), "w", encoding="utf-8")
    proc = subprocess.Popen(command, cwd=run_dir, env=run_env(run_dir, **(env or {})),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    log.close()  # the server has its own copy
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{command[0]} did not listen on 127.0.0.1:{port} (see {log_name})")


def start_python_http(sc: Scenario, kind: str, run_dir: str, servers: list[subprocess.Popen]) -> list[str]:
    """Starts py_http_server.py (and, for the proxied run, the fault proxy
    in front of it and a config naming the proxy); returns what the client
    connects to: the server's URL, or the mcp-retry command."""
    port = free_port()
    command = [PYTHON, os.path.join(HERE, "py_http_server.py"), str(port), os.path.join(run_dir, "executions.jsonl")]
    servers.append(start_listening(command + (["--event-store"] if sc.py_http else []), port, run_dir, "http-server.log"))
    if kind == "direct":
        return [f"http://127.0.0.1:{port}/mcp"]
    front = free_port()
    fault = [PYTHON, os.path.join(HERE, "fault_proxy.py"), str(front), str(port),
             os.path.join(run_dir, "fault-proxy.jsonl"), "--cut-after-progress", CUT_CALL]
    servers.append(start_listening(fault, front, run_dir, "fault-proxy.log"))
    config = os.path.join(run_dir, "mcp-retry.yaml")
    with open(config, "w", encoding="utf-8") as f:
        f.write(f"servers:\n  remote:\n    url: http://127.0.0.1:{front}/mcp\n")
    return ["run", "--config", config]


# ---------------------------------------------------------------- running


@dataclass
class RunResult:
    kind: str  # "direct" or "proxied"
    dir: str
    exit_code: int | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    cancelled: list[dict[str, Any]] = field(default_factory=list)
    client_wire: list[dict[str, Any]] = field(default_factory=list)  # {"dir", "line"}
    server_wire: list[dict[str, Any]] = field(default_factory=list)
    executions: list[dict[str, Any]] = field(default_factory=list)  # py_http_server.py's log
    faults: list[dict[str, Any]] = field(default_factory=list)  # fault_proxy.py's log
    stderr: str = ""
    failure: str | None = None  # the run itself broke


def read_jsonl(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_once(sc: Scenario, kind: str, proxy: str, base: str) -> RunResult:
    via = "-http" if sc.http else {None: "", True: "-event-store", False: "-no-event-store"}[sc.py_http]
    run_dir = os.path.join(base, f"{sc.client}-{sc.mode}-{sc.script}{via}-{kind}")
    os.makedirs(os.path.join(run_dir, "root"))
    result = RunResult(kind, run_dir)
    tap = [PYTHON, os.path.join(HERE, "tap.py")]
    server = sc.command(run_dir)
    servers: list[subprocess.Popen] = []
    if sc.py_http is not None:
        target = start_python_http(sc, kind, run_dir, servers)
        launched = target if kind == "direct" else tap + [os.path.join(run_dir, "client-wire.jsonl"), "--", proxy] + target
    elif kind == "proxied" and sc.http:
        port = free_port()
        servers.append(start_listening(sc.http(run_dir), port, run_dir, "http-server.log", {"PORT": str(port)}))
        url = f"http://127.0.0.1:{port}/mcp"
        launched = tap + [os.path.join(run_dir, "client-wire.jsonl"), "--", proxy, "run", "--url", url]
    elif kind == "direct":
        launched = tap + [os.path.join(run_dir, "client-wire.jsonl"), "--"] + server
    else:
        launched = (
            tap
            + [os.path.join(run_dir, "client-wire.jsonl"), "--", proxy, "run", "--"]
            + tap
            + [os.path.join(run_dir, "server-wire.jsonl"), "--"]
            + server
        )
    out = os.path.join(run_dir, "client-out.json")
    if sc.client == "python":
        client = [PYTHON, os.path.join(HERE, "py_client.py"), sc.script, sc.mode, out, "--"]
    else:
        client = ["node", os.path.join(HERE, "ts_client.mjs"), sc.script, out, "--"]
    env = run_env(run_dir, INTEROP_ROOT=os.path.join(run_dir, "root"), MCP_RETRY_LOG="info", NO_PROXY="127.0.0.1")
    env.update(sc.env(run_dir))
    with open(os.path.join(run_dir, "stderr.log"), "w+", encoding="utf-8") as err:
        try:
            proc = subprocess.run(
                client + launched, cwd=run_dir, env=env, stdin=subprocess.DEVNULL,
                stdout=err, stderr=err, timeout=RUN_TIMEOUT,
            )
            result.exit_code = proc.returncode
        except subprocess.TimeoutExpired:
            result.failure = f"the client did not finish within {RUN_TIMEOUT}s"
        finally:
            for proc in servers:
                proc.terminate()
                proc.wait(10)
        err.seek(0)
        result.stderr = err.read()
    if result.failure is None and result.exit_code != 0:
        result.failure = f"the client exited with status {result.exit_code}"
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            data = json.load(f)
        result.steps, result.cancelled = data["steps"], data["cancelled"]
    elif result.failure is None:
        result.failure = "the client wrote no results"
    result.client_wire = read_jsonl(os.path.join(run_dir, "client-wire.jsonl"))
    result.server_wire = read_jsonl(os.path.join(run_dir, "server-wire.jsonl")) if kind == "proxied" else result.client_wire
    result.executions = read_jsonl(os.path.join(run_dir, "executions.jsonl"))
    result.faults = read_jsonl(os.path.join(run_dir, "fault-proxy.jsonl"))
    return result


# ---------------------------------------------------------- normalization
#
# Everything that may legitimately differ between the two runs, and nothing
# else, is normalized away here:
#
# 1. Paths of the run's own temp dir ("<base>/<scenario>-direct" vs
#    "...-proxied"): the filesystem server's root and the memory file live
#    there. Replaced by $RUN.
# 2. server-everything's dynamic resources embed the time they were made
#    ("... created at 10:23:45 AM", new Date().toLocaleTimeString()), also
#    inside base64 blobs. Replaced by $TIME.
# 3. `requestState` of the 2026-07-28 multi-round-trip flow: the Python SDK
#    server seals it with a key made at startup, so its bytes differ per run
#    (the client hands it back unchanged). Replaced by $REQUEST_STATE.
# 4. Our own marker: result._meta["mcp-retry/source"] ("dedup", "cache",
#    "stale") says an answer did not come from a fresh execution. Removed
#    (and `_meta` with it when it held nothing else).
# 5. On the wire only: the ids of requests the server makes to the client
#    (sampling, elicitation, roots): mcp-retry gives them ids of its own, so
#    they are dropped from those requests and from the client's answers.
#    Ids of the client's own requests are NOT dropped: the proxy must
#    restore them exactly.
# 6. Over Streamable HTTP only: server-everything sends
#    notifications/tools/list_changed while the session is being set up,
#    before any stream exists that could carry them (the GET stream opens
#    after `initialized`), so its HTTP transport drops them (the spec lets a
#    server drop what it has no stream for). They are left out of both runs.
#    The tap between mcp-retry and the server does not exist either: the
#    checks that read the server's side of the wire are left out.
# 7. Python SDK client against the Python SDK server over Streamable HTTP:
#    the progress tokens in "notifications received" are renumbered in the
#    order they appear. The SDK uses its request ids as tokens, and the two
#    runs number their requests differently on purpose: in 2026-07-28,
#    directly, the client's first `locate` is refused (-32020), and the
#    client re-reads tools/list and resends it under new ids; through
#    mcp-retry, mcp-retry does that itself and the client sees one call.
#    The direct run has no stdio wire (its client speaks HTTP): the wire is
#    checked on the proxied side alone (one answer per request, under its
#    id), and the server's execution log is compared instead.
# 8. mcp-retry's own progress while a call waits (a retry's backoff, a
#    server coming back) is not in the direct run: a notification with no
#    `total` whose message says what it waits for ("waiting …"). It is
#    taken out of the proxied run's progress before comparing, and checked
#    on its own (`wait_notice_checks`): every progress value of a token,
#    the proxy's and the server's, is above the one before.

TIME_RE = re.compile(r"created at \d{1,2}:\d{2}:\d{2}(?:\s?[AP]M)?")
OUR_META = "mcp-retry/source"


class RawNum(str):
    """A JSON number kept as the exact text it was sent as."""


class Obj(list):
    """A JSON object as its ordered (key, value) members."""

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self:
            if k == key:
                return v
        return default


def parse_wire(line: str) -> Any:
    """Parses a wire line keeping member order and number text, so that
    rendering it back shows any change the proxy made to the bytes."""
    return json.loads(line, object_pairs_hook=Obj, parse_int=RawNum, parse_float=RawNum, parse_constant=RawNum)


def render(value: Any) -> str:
    if isinstance(value, RawNum):
        return str(value)
    if isinstance(value, Obj):
        return "{" + ",".join(json.dumps(k) + ":" + render(v) for k, v in value) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + render(v) for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(render(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def normalize(value: Any, run_dir: str) -> Any:
    paths = sorted({run_dir, os.path.realpath(run_dir)}, key=len, reverse=True)

    def text(s: str) -> str:
        for p in paths:
            s = s.replace(p, "$RUN")
        return TIME_RE.sub("created at $TIME", s)

    def walk(v: Any) -> Any:
        if isinstance(v, RawNum):
            return v
        if isinstance(v, str):
            return text(v)
        if isinstance(v, (Obj, dict)):
            items = list(v) if isinstance(v, Obj) else list(v.items())
            uri = next((x for k, x in items if k == "uri"), None)
            out = []
            for k, x in items:
                if k == "blob" and isinstance(uri, str) and uri.startswith("demo://resource/dynamic/blob/"):
                    x = "$BLOB:" + text(base64.b64decode(x).decode("utf-8", "replace"))
                elif k in ("requestState", "request_state") and isinstance(x, str):
                    x = "$REQUEST_STATE"
                elif k == "_meta" and isinstance(x, (Obj, dict)):
                    kept = [(mk, mv) for mk, mv in (x if isinstance(x, Obj) else x.items()) if mk != OUR_META]
                    if not kept:
                        continue
                    x = Obj(kept) if isinstance(x, Obj) else dict(kept)
                out.append((text(k), walk(x)))
            return Obj(out) if isinstance(v, Obj) else dict(out)
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value)


# ------------------------------------------------------------------ checks


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def diff(direct: Any, proxied: Any, limit: int = 60) -> str:
    a = pretty_lines(direct)
    b = pretty_lines(proxied)
    lines = list(difflib.unified_diff(a, b, "direct", "through mcp-retry", n=2, lineterm=""))
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more diff lines)"]
    return "\n".join(lines)


def pretty_lines(value: Any) -> list[str]:
    try:
        return json.dumps(json.loads(render(value)), indent=1, ensure_ascii=False).splitlines()
    except (TypeError, ValueError):
        return repr(value).splitlines()


LOST_OVER_HTTP = "notifications/tools/list_changed"


def without_setup_notes(value: Any) -> Any:
    """Normalizer 6, for a list of notifications."""
    if isinstance(value, list):
        return [v for v in value if not (isinstance(v, dict) and v.get("method") == LOST_OVER_HTTP)]
    return value


def is_wait_notice(v: Any) -> bool:
    """Normalizer 8: one of mcp-retry's own progress notifications while a
    call waits, as a notification or as a client's progress record."""
    if not isinstance(v, dict):
        return False
    params = v.get("params") if v.get("method") == "notifications/progress" else v
    return (isinstance(params, dict) and params.get("total") is None
            and str(params.get("message") or "").startswith("waiting "))


def without_wait_notices(value: Any) -> Any:
    """Normalizer 8, for a list of notifications or progress records."""
    if isinstance(value, list):
        return [v for v in value if not is_wait_notice(v)]
    return value


def wait_notice_checks(proxied: RunResult) -> list[Check]:
    """Normalizer 8's own check: through mcp-retry, each progress token's
    values only increase, the proxy's wait notices among them."""
    checks = []
    for step in proxied.steps:
        if step["name"] != "notifications received" or not isinstance(step["value"], list):
            continue
        last: dict[str, float] = {}
        bad = []
        notices = 0
        for v in step["value"]:
            if not (isinstance(v, dict) and v.get("method") == "notifications/progress"):
                continue
            params = v.get("params") or {}
            token = json.dumps(params.get("progressToken"))
            value = params.get("progress")
            notices += is_wait_notice(v)
            if isinstance(value, (int, float)):
                if token in last and value <= last[token]:
                    bad.append(f"{token}: {value} after {last[token]}")
                last[token] = value
        if notices:
            checks.append(Check(f"mcp-retry's {notices} wait notice(s) keep every token's progress increasing",
                                not bad, "\n".join(bad)))
    return checks


def renumbered_tokens(value: Any) -> Any:
    """Normalizer 7, for a list of notifications."""
    if not isinstance(value, list):
        return value
    tokens: dict[str, str] = {}
    out = []
    for v in value:
        params = v.get("params") if isinstance(v, dict) else None
        if isinstance(params, dict) and "progressToken" in params:
            token = tokens.setdefault(json.dumps(params["progressToken"]), f"$TOKEN{len(tokens) + 1}")
            v = dict(v, params=dict(params, progressToken=token))
        out.append(v)
    return out


def compare_steps(direct: RunResult, proxied: RunResult, http: bool, tokens: bool = False) -> list[Check]:
    checks = []
    d_steps = {s["name"]: s for s in direct.steps}
    p_steps = {s["name"]: s for s in proxied.steps}
    for name in list(d_steps) + [n for n in p_steps if n not in d_steps]:
        d, p = d_steps.get(name), p_steps.get(name)
        if d is None or p is None:
            checks.append(Check(name, False, f"step missing in the {'direct' if d is None else 'proxied'} run"))
            continue
        dv, pv = normalize(d["value"], direct.dir), normalize(p["value"], proxied.dir)
        if http and name == "notifications received":
            dv, pv = without_setup_notes(dv), without_setup_notes(pv)
        if name in ("notifications received", "progress notifications of the cut count"):
            pv = without_wait_notices(pv)
        if tokens and name == "notifications received":
            dv, pv = renumbered_tokens(dv), renumbered_tokens(pv)
        if not d["ok"]:
            checks.append(Check(name, False, "the direct run did not do what the scenario expects "
                                             "(the suite or the server changed):\n" + "\n".join(pretty_lines(dv)[:40])))
        elif render(dv) != render(pv):
            checks.append(Check(name, False, diff(dv, pv)))
        else:
            checks.append(Check(name, True))
    return checks + wait_notice_checks(proxied)


def classify(wire: list[dict[str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """Splits a tap log into kinds of messages, each with its raw line."""
    kinds: dict[str, list[tuple[str, Any]]] = {
        k: [] for k in ("client_requests", "responses_to_client", "server_requests",
                        "client_answers", "to_client_notifications", "from_client_notifications", "garbage")
    }
    for entry in wire:
        line, direction = entry["line"], entry["dir"]
        try:
            msg = parse_wire(line)
        except ValueError:
            kinds["garbage"].append((line, None))
            continue
        if not isinstance(msg, Obj):
            kinds["garbage"].append((line, msg))
            continue
        has_id = any(k == "id" for k, _ in msg)
        has_method = msg.get("method") is not None
        if direction == "in":
            kind = ("client_requests" if has_id else "from_client_notifications") if has_method else "client_answers"
        else:
            kind = ("server_requests" if has_id else "to_client_notifications") if has_method else "responses_to_client"
        kinds[kind].append((line, msg))
    return kinds


def exact(line: str, msg: Any, run_dir: str) -> str:
    """The line itself, byte for byte, when normalization leaves it alone;
    else its normalized rendering (member order and number text kept)."""
    normalized = render(normalize(msg, run_dir))
    return line if normalized == render(msg) else normalized


def without_id(msg: Obj) -> Obj:
    return Obj([(k, v) for k, v in msg if k != "id"])


def cancelled_tokens(kinds: dict[str, list[tuple[str, Any]]]) -> set[str]:
    """Progress tokens of client requests that the client cancelled."""
    cancelled = set()
    for _line, n in kinds["from_client_notifications"]:
        if n.get("method") == "notifications/cancelled":
            cancelled.add(render(n.get("params").get("requestId")))
    tokens = set()
    for _line, r in kinds["client_requests"]:
        if render(r.get("id")) in cancelled:
            meta = (r.get("params") or Obj()).get("_meta") or Obj()
            if meta.get("progressToken") is not None:
                tokens.add(render(meta.get("progressToken")))
    return tokens


def handshake(kinds: dict[str, list[tuple[str, Any]]]) -> str:
    """How the session was opened, as seen on the client's side of the wire:
    e.g. "server/discover -> error -32601, initialize -> 2025-11-25"."""
    answers = {render(m.get("id")): m for _l, m in kinds["responses_to_client"]}
    steps = []
    for _l, r in kinds["client_requests"]:
        method = r.get("method")
        if method not in ("server/discover", "initialize"):
            continue
        a = answers.get(render(r.get("id")))
        if a is None:
            steps.append(f"{method} -> no answer")
        elif a.get("error") is not None:
            steps.append(f"{method} -> error {render(a.get('error').get('code'))}")
        elif method == "initialize":
            steps.append(f"{method} -> {a.get('result').get('protocolVersion')}")
        else:
            steps.append(f"{method} -> {render(a.get('result').get('supportedVersions'))}")
    return ", ".join(steps) or "no handshake"


def not_answered_once(kinds: dict[str, list[tuple[str, Any]]]) -> list[str]:
    """The client requests (but those it cancelled) that did not get
    exactly one answer, each as a line for the report."""
    answered: dict[str, int] = {}
    for _l, m in kinds["responses_to_client"]:
        answered[render(m.get("id"))] = answered.get(render(m.get("id")), 0) + 1
    requested = {render(m.get("id")) for _l, m in kinds["client_requests"]}
    cancelled = {render(n.get("params").get("requestId")) for _l, n in kinds["from_client_notifications"]
                 if n.get("method") == "notifications/cancelled"}
    return [f"id {rid}: {answered.get(rid, 0)} answers through the proxy (want exactly one)"
            for rid in sorted(requested - cancelled) if answered.get(rid, 0) != 1]


def wire_checks(direct: RunResult, proxied: RunResult, http: bool) -> list[Check]:
    checks = []
    kd, kp = classify(direct.client_wire), classify(proxied.client_wire)
    hd, hp = handshake(kd), handshake(kp)
    checks.append(Check(f"wire: handshake {hd}", hd == hp, "" if hd == hp else f"direct:  {hd}\nproxied: {hp}"))

    # Every client request gets exactly one answer, under its own id, with
    # the same bytes as direct (after normalization).
    def answers(kinds, run_dir):
        by_id: dict[str, list[tuple[str, bool]]] = {}
        for line, m in kinds["responses_to_client"]:
            result = m.get("result")
            meta = result.get("_meta") if isinstance(result, Obj) else None
            ours = isinstance(meta, Obj) and meta.get(OUR_META) is not None
            by_id.setdefault(render(m.get("id")), []).append((exact(line, m, run_dir), ours))
        return by_id

    def same(a: tuple[str, bool], b: tuple[str, bool]) -> bool:
        if a[0] == b[0]:
            return True
        # An answer mcp-retry made itself (a dedup or cache replay) has its
        # members in our order: compare it as data.
        return b[1] and json.loads(a[0]) == json.loads(b[0])

    ad, ap = answers(kd, direct.dir), answers(kp, proxied.dir)
    problems = []
    for rid in sorted(set(ad) | set(ap), key=lambda s: (len(s), s)):
        a, b = ad.get(rid, []), ap.get(rid, [])
        if len(a) != len(b) or not all(same(x, y) for x, y in zip(a, b)):
            problems.append(f"id {rid}:\n  direct:  {[x for x, _ in a]}\n  proxied: {[y for y, _ in b]}")
    problems += not_answered_once(kp)
    checks.append(Check("wire: every answer to the client is byte-identical, under the client's own id",
                        not problems, "\n".join(problems[:10])))

    # The client sent the same requests and notifications in both runs (the
    # scripts are deterministic; a difference here means the proxy changed
    # what the client saw before it sent them).
    def sent(kinds, run_dir):
        return [exact(line, m, run_dir) for line, m in kinds["client_requests"] + kinds["from_client_notifications"]]

    sd, sp = sent(kd, direct.dir), sent(kp, proxied.dir)
    checks.append(Check("wire: the client sent the same requests and notifications", sd == sp,
                        "" if sd == sp else diff(sd, sp)))

    # Requests from the server reach the client unchanged (but for the id
    # mcp-retry gives them), and the client's answers reach the server under
    # the server's own ids.
    def server_requests(kinds, run_dir):
        return [render(normalize(without_id(m), run_dir)) for _l, m in kinds["server_requests"]]

    def client_answers(kinds, run_dir):
        return [render(normalize(without_id(m), run_dir)) for _l, m in kinds["client_answers"]]

    rd, rp = server_requests(kd, direct.dir), server_requests(kp, proxied.dir)
    checks.append(Check("wire: requests from the server reach the client unchanged", rd == rp,
                        "" if rd == rp else diff(rd, rp)))
    cd, cp = client_answers(kd, direct.dir), client_answers(kp, proxied.dir)
    problems = [] if cd == cp else [diff(cd, cp)]
    # In the proxied run, each answer the server got must carry the id of a
    # request it made, once.
    server_kinds = classify(proxied.server_wire)
    made = [render(m.get("id")) for _l, m in server_kinds["server_requests"]]
    got = [render(m.get("id")) for _l, m in server_kinds["client_answers"]]
    if sorted(made) != sorted(got):
        problems.append(f"the server made requests with ids {made} but got answers for {got}")
    name = "wire: the client's answers reach the server under the server's ids"
    if http:
        name = "wire: the client's answers are the same"
    checks.append(Check(name, not problems, "\n".join(problems)))

    # Notifications reach the client unchanged and in order. mcp-retry
    # forwards progress only while a call is live (documented: a cancelled
    # call's progress is dropped), so progress for the calls the client
    # cancelled is left out on both sides.
    def notes(kinds, run_dir):
        tokens = cancelled_tokens(kinds)
        out = []
        for line, n in kinds["to_client_notifications"]:
            if http and n.get("method") == LOST_OVER_HTTP:
                continue
            params = n.get("params") or Obj()
            if n.get("method") == "notifications/progress" and render(params.get("progressToken")) in tokens:
                continue
            out.append(exact(line, n, run_dir))
        return out

    nd, np_ = notes(kd, direct.dir), notes(kp, proxied.dir)
    checks.append(Check("wire: notifications reach the client unchanged and in order", nd == np_,
                        "" if nd == np_ else diff(nd, np_)))
    garbage = kp["garbage"] + classify(proxied.server_wire)["garbage"]
    checks.append(Check("wire: every line is a JSON-RPC message", not garbage,
                        "\n".join(line for line, _ in garbage[:5])))
    return checks


def cancel_checks(direct: RunResult, proxied: RunResult, http: bool) -> list[Check]:
    """For each call the client cancelled: the server got
    notifications/cancelled naming the id it knows the call by, and the
    client never got an answer for it (over HTTP, where the server's side
    is not tapped: the client never got an answer)."""
    checks = []
    for i, c in enumerate(proxied.cancelled):
        facts = []
        for run in (direct, proxied):
            server = classify(run.server_wire)
            client = classify(run.client_wire)
            ids = [render(m.get("id")) for _l, m in server["client_requests"]
                   if m.get("method") == "tools/call"
                   and json.loads(render((m.get("params") or Obj()).get("arguments") or Obj())) == c["arguments"]
                   and (m.get("params") or Obj()).get("name") == c["tool"]]
            sid = ids[0] if ids else None
            cancels = [render(n.get("params").get("requestId")) for _l, n in server["from_client_notifications"]
                       if n.get("method") == "notifications/cancelled"]
            cids = [render(m.get("id")) for _l, m in client["client_requests"]
                    if m.get("method") == "tools/call" and (m.get("params") or Obj()).get("name") == c["tool"]
                    and json.loads(render((m.get("params") or Obj()).get("arguments") or Obj())) == c["arguments"]]
            cid = cids[0] if cids else None
            facts.append({
                "the server got the call": sid is not None,
                "the server got notifications/cancelled for its id": sid is not None and sid in cancels,
                "the client got no answer": cid is not None and not any(
                    render(m.get("id")) == cid for _l, m in client["responses_to_client"]),
            })
        name = f"cancellation #{i + 1} reached the server under its id, and was not answered"
        if http:
            facts = [{k: v for k, v in f.items() if k == "the client got no answer"} for f in facts]
            name = f"cancellation #{i + 1} was not answered"
        ok = facts[0] == facts[1] and all(facts[1].values())
        detail = "" if ok else f"direct:  {facts[0]}\nproxied: {facts[1]}"
        checks.append(Check(name, ok, detail))
    return checks


def proxied_wire_checks(proxied: RunResult) -> list[Check]:
    """The proxied wire alone, where the direct run has none (its client
    speaks HTTP): each request answered once, under its id; no garbage."""
    kinds = classify(proxied.client_wire)
    problems = not_answered_once(kinds)
    if not kinds["client_requests"]:
        problems.append("the client sent no request through the proxy")
    return [
        Check("wire: every request got exactly one answer through mcp-retry, under the client's own id",
              not problems, "\n".join(problems[:10])),
        Check("wire: every line is a JSON-RPC message", not kinds["garbage"],
              "\n".join(line for line, _ in kinds["garbage"][:5])),
    ]


def python_http_checks(sc: Scenario, direct: RunResult, proxied: RunResult) -> list[Check]:
    """The Python SDK server over Streamable HTTP: the proxied wire, what
    the server executed in each run, and what the fault proxy saw."""
    checks = proxied_wire_checks(proxied)

    def runs(r: RunResult) -> dict[str, int]:
        counts: dict[str, int] = {}
        for e in r.executions:
            key = json.dumps(e, sort_keys=True, ensure_ascii=False)
            counts[key] = counts.get(key, 0) + 1
        return counts

    cut = json.dumps({"tool": "count", "arguments": {"steps": 4, "delay": 0.25}}, sort_keys=True)
    resumable = sc.mode == "legacy" and bool(sc.py_http)
    want = dict(runs(direct))
    if resumable:
        name = "the server ran every tool as often as directly: the cut call once (resumed from the event store)"
    else:
        # Nothing to resume from (no event ids; 2026-07-28 streams are not
        # resumable): count is read-only, so mcp-retry sent it again.
        want[cut] = 2
        name = "the server ran every tool as often as directly, the cut call twice (safe, sent again)"
    got = runs(proxied)
    checks.append(Check(name, got == want, "" if got == want else diff(want, got)))

    cuts = [f for f in proxied.faults if f["cut"]]
    checks.append(Check("the fault proxy cut the call's stream", len(cuts) == 1, json.dumps(proxied.faults)[:2000]))
    resumed = [f for f in proxied.faults if f["last_event_id"] is not None]
    if resumable:
        checks.append(Check("mcp-retry resumed the cut stream with GET and Last-Event-ID",
                            any(f["method"] == "GET" for f in resumed), json.dumps(proxied.faults)[:2000]))
    else:
        why = "2026-07-28 streams are not resumable" if sc.mode == "auto" else "no event ids to resume from"
        checks.append(Check(f"mcp-retry sent no Last-Event-ID ({why})", not resumed, json.dumps(resumed)[:2000]))
    return checks


def expected_warnings(sc: Scenario) -> tuple[str, ...]:
    """What mcp-retry must log in the Python-over-HTTP scenarios, each for
    a reason: the spec asks a client to warn when it leaves out a tool with
    an invalid x-mcp-header (py_http_server.py's `misdeclared`, 2026-07-28);
    and in the 2025 era without an event store, the cut stream cannot be
    resumed, so the session is lost (mcp-retry starts a new one)."""
    if sc.mode == "auto":
        return ("with an invalid x-mcp-header",)
    if not sc.py_http:
        return ("broke the connection (the answer's stream broke",)
    return ()


def proxy_log_check(proxied: RunResult, expected: tuple[str, ...] = ()) -> Check:
    bad = [l for l in proxied.stderr.splitlines() if l.startswith(("mcp-retry: warn", "mcp-retry: error"))
           and not any(e in l for e in expected)]
    return Check("mcp-retry logged no warning or error", not bad, "\n".join(bad[:10]))


FAULTS_LABEL = "python-sdk [initialize] x python-sdk server over Streamable HTTP, behind a fault proxy"


def fault_checks(proxy: str, base: str) -> tuple[list[Check], str]:
    """py_faults.py's group: its checks, and its run directory."""
    run_dir = os.path.join(base, "python-http-faults")
    os.makedirs(run_dir)
    out = os.path.join(run_dir, "checks.json")
    env = run_env(run_dir, MCP_RETRY_LOG="info", NO_PROXY="127.0.0.1")
    with open(os.path.join(run_dir, "stderr.log"), "w+", encoding="utf-8") as err:
        try:
            subprocess.run([PYTHON, os.path.join(HERE, "py_faults.py"), proxy, run_dir, out], cwd=run_dir,
                           env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=3 * RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        err.seek(0)
        tail = "\n".join(err.read().splitlines()[-25:])
    if not os.path.exists(out):
        return [Check("the fault scenarios completed", False, f"no checks written; stderr ends:\n{tail}")], run_dir
    with open(out, encoding="utf-8") as f:
        return [Check(c["name"], c["ok"], c["detail"]) for c in json.load(f)["checks"]], run_dir


INSTANT_LABEL = ("python-sdk [initialize] x server-everything and server-filesystem through npx on an empty "
                 "npm cache, with instant_start")


def instant_checks(proxy: str, base: str) -> tuple[list[Check], str]:
    """py_instant.py's group: its checks, and its run directory."""
    run_dir = os.path.join(base, "instant-start")
    os.makedirs(run_dir)
    out = os.path.join(run_dir, "checks.json")
    with open(os.path.join(run_dir, "stderr.log"), "w+", encoding="utf-8") as err:
        try:
            subprocess.run([PYTHON, os.path.join(HERE, "py_instant.py"), proxy, run_dir, out], cwd=run_dir,
                           env=run_env(run_dir), stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=6 * RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        err.seek(0)
        log = err.read().splitlines()
    # Its timings, for the report.
    for line in log:
        if line.startswith("py_instant: "):
            print("      " + line[len("py_instant: "):])
    if not os.path.exists(out):
        tail = "\n".join(log[-25:])
        return [Check("the instant start sessions completed", False, f"no checks written; stderr ends:\n{tail}")], run_dir
    with open(out, encoding="utf-8") as f:
        return [Check(c["name"], c["ok"], c["detail"]) for c in json.load(f)["checks"]], run_dir


# The official client conformance scenarios (@modelcontextprotocol/conformance):
# the tool starts a test server of its own for each and runs
# conformance_client.mjs against it, which connects directly (the SDK's
# Streamable HTTP client) or, as a stdio client, through `mcp-retry run
# --url`. The tool judges the server's side (checks.json); each of its
# verdicts becomes a check here, and so does what the client got.
CONFORMANCE_SCENARIOS = ("initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry")
CONFORMANCE_CLI = os.path.join(NODE_MODULES, "@modelcontextprotocol", "conformance", "dist", "index.js")
# The tool's verdict on reconnection timing is WARNING when the reconnect
# came up to 200 ms after `retry:` ("acceptable but may indicate network
# delays"): on a loaded machine that is the scheduler, not the client.
# Anything later, or earlier, is a FAILURE, and any other WARNING fails here.
CONFORMANCE_LATE_OK = "client-sse-retry-timing"


def conformance_label(scenario: str) -> str:
    return f"typescript-sdk [initialize] x conformance client scenario {scenario} over Streamable HTTP"


def conformance_once(scenario: str, kind: str, proxy: str, base: str) -> tuple[RunResult, list[dict[str, Any]]]:
    """One run of the conformance tool: the client's result, and the
    tool's checks (those with a verdict: SUCCESS, FAILURE or WARNING)."""
    run_dir = os.path.join(base, f"conformance-{scenario}-{kind}")
    results = os.path.join(run_dir, "results")
    os.makedirs(results)
    result = RunResult(kind, run_dir)
    out = os.path.join(run_dir, "client-out.json")
    env = run_env(run_dir, INTEROP_OUT=out, MCP_RETRY_LOG="info", NO_PROXY="127.0.0.1,localhost")
    if kind == "proxied":
        wire = os.path.join(run_dir, "client-wire.jsonl")
        env["INTEROP_PROXY"] = json.dumps([PYTHON, os.path.join(HERE, "tap.py"), wire, "--", proxy])
    # The tool splits --command at spaces and runs it with a shell.
    client = "node " + shlex.quote(os.path.join(HERE, "conformance_client.mjs"))
    # The tool's test servers listen on every interface: loopback.cjs would
    # make listen() asynchronous, and the tool reads the port back at once.
    command = ["node", CONFORMANCE_CLI, "client", "--scenario", scenario, "--command", client, "-o", results]
    with open(os.path.join(run_dir, "conformance.log"), "w+", encoding="utf-8") as log:
        try:
            subprocess.run(command, cwd=run_dir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                           timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            result.failure = f"the conformance tool did not finish within {RUN_TIMEOUT}s"
        log.seek(0)
        tool_log = log.read()
    found = {name: os.path.join(d, name) for d, _dirs, files in os.walk(results) for name in files}
    if "stderr.txt" in found:
        with open(found["stderr.txt"], encoding="utf-8") as f:
            result.stderr = f.read()  # the client's stderr, and so mcp-retry's
    if os.path.exists(out):
        with open(out, encoding="utf-8") as f:
            result.steps = json.load(f)["steps"]
    elif result.failure is None:
        tail = "\n".join(tool_log.splitlines()[-25:])
        result.failure = f"the client did not finish the scenario; the conformance tool's output ends:\n{tail}"
    result.client_wire = read_jsonl(os.path.join(run_dir, "client-wire.jsonl"))
    verdicts = []
    if "checks.json" in found:
        with open(found["checks.json"], encoding="utf-8") as f:
            verdicts = [c for c in json.load(f) if c.get("status") in ("SUCCESS", "FAILURE", "WARNING")]
    return result, verdicts


def conformance_checks(scenario: str, proxy: str, base: str) -> tuple[list[Check], list[str]]:
    """A client scenario run directly and through mcp-retry: the tool's
    verdicts on both, what the client got, the proxied wire and log."""
    direct, d_verdicts = conformance_once(scenario, "direct", proxy, base)
    proxied, p_verdicts = conformance_once(scenario, "proxied", proxy, base)
    checks = [Check(f"the {r.kind} run completed", False, r.failure) for r in (direct, proxied) if r.failure]
    d_status = {c["id"]: c["status"] for c in d_verdicts}
    p_ids = [c["id"] for c in p_verdicts]
    if not p_verdicts or sorted(p_ids) != sorted(d_status):
        checks.append(Check("the conformance tool judged the same checks directly and through mcp-retry", False,
                            f"direct:  {sorted(d_status)}\nproxied: {sorted(p_ids)}"))
    for c in p_verdicts:
        status = c["status"]
        late = c["id"] == CONFORMANCE_LATE_OK and "slightly late" in (c.get("errorMessage") or "")
        ok = status == "SUCCESS" or (status == "WARNING" and late)
        name = f"conformance {c['id']}: {status} through mcp-retry ({d_status.get(c['id'], 'absent')} directly)"
        why = c.get("errorMessage") or (c.get("details") or {}).get("message") or ""
        checks.append(Check(name, ok, "" if ok else f"{c.get('description', '')}: {why}"))
    checks += compare_steps(direct, proxied, False)
    checks += proxied_wire_checks(proxied)
    checks.append(proxy_log_check(proxied))
    return checks, [direct.dir, proxied.dir]


def report(label: str, checks: list[Check], dirs: list[str]) -> tuple[int, int]:
    """Prints one line per check; returns (passed, failed)."""
    for c in checks:
        print(f"{'PASS' if c.ok else 'FAIL'}  {label}: {c.name}")
        if not c.ok and c.detail:
            print("\n".join("      " + l for l in c.detail.splitlines()))
    failed = sum(not c.ok for c in checks)
    if failed:
        print(f"      (wire logs and stderr: {' and '.join(dirs)})")
    return len(checks) - failed, failed


# ------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proxy", required=True, help="path to the mcp-retry binary")
    ap.add_argument("--only", help="run only the scenarios whose label contains this text")
    ap.add_argument("--keep", action="store_true", help="keep the runs' directories (wire logs, stderr)")
    args = ap.parse_args()
    proxy = os.path.abspath(args.proxy)
    if not os.access(proxy, os.X_OK):
        print(f"interop: {proxy} is not an executable", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="mcp-retry-interop-")
    passed = failed = 0
    for sc in scenarios():
        if args.only and args.only not in sc.label:
            continue
        print(f"\n== {sc.label}", flush=True)
        direct = run_once(sc, "direct", proxy, base)
        proxied = run_once(sc, "proxied", proxy, base)
        checks: list[Check] = []
        for r in (direct, proxied):
            if r.failure:
                tail = "\n".join(r.stderr.splitlines()[-25:])
                checks.append(Check(f"the {r.kind} run completed", False, f"{r.failure}; stderr ends:\n{tail}"))
        if sc.py_http is not None:
            checks += compare_steps(direct, proxied, False, tokens=True)
            checks += python_http_checks(sc, direct, proxied)
            checks.append(proxy_log_check(proxied, expected_warnings(sc)))
        else:
            http = sc.http is not None
            checks += compare_steps(direct, proxied, http)
            checks += wire_checks(direct, proxied, http)
            checks += cancel_checks(direct, proxied, http)
            checks.append(proxy_log_check(proxied))
        p, f = report(sc.label, checks, [direct.dir, proxied.dir])
        passed, failed = passed + p, failed + f
    for scenario in CONFORMANCE_SCENARIOS:
        label = conformance_label(scenario)
        if args.only and args.only not in label:
            continue
        print(f"\n== {label}", flush=True)
        checks, dirs = conformance_checks(scenario, proxy, base)
        p, f = report(label, checks, dirs)
        passed, failed = passed + p, failed + f
    # Network faults between mcp-retry and a real server: one group, one
    # server and one session for all of them (py_faults.py).
    if not args.only or args.only in FAULTS_LABEL:
        print(f"\n== {FAULTS_LABEL}", flush=True)
        checks, run_dir = fault_checks(proxy, base)
        p, f = report(FAULTS_LABEL, checks, [run_dir])
        passed, failed = passed + p, failed + f
    # A slow start hidden from the client: npx on an empty npm cache, two
    # sessions per server, the second answered from the handshake cache.
    if not args.only or args.only in INSTANT_LABEL:
        print(f"\n== {INSTANT_LABEL}", flush=True)
        checks, run_dir = instant_checks(proxy, base)
        p, f = report(INSTANT_LABEL, checks, [run_dir])
        passed, failed = passed + p, failed + f
    if failed == 0 and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\nrun directories kept in {base}")
    print(f"\n{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
