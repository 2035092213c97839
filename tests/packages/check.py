#!/usr/bin/env python3
"""Installs the npm and Python packages that `make packages` (or `make dist`)
built, the way a user would, and runs mcp-retry through each: the launcher
and its platform package from their tarballs (`npx mcp-retry`), the wheel in
a fresh venv (`pip install`), and the wheel through `uvx --from`.

Then the macOS packages, which this machine cannot run: the binary in each
npm package (@mcp-retry/darwin-arm64, darwin-x64) and in each wheel
(macosx_11_0_arm64, macosx_10_12_x86_64) is the same file, recorded in the
wheel's RECORD, and passes macho.py (architecture, minimum macOS, system
libraries only, ad-hoc signature); the package's os and cpu fields are
macOS's and the launcher names it as an optional dependency.

Usage: check.py DIST MOCK UVX
  DIST  the directory with mcp-retry-X.tgz, mcp-retry-linux-x64-X.tgz and a
        linux x86_64 mcp_retry_rs wheel, and the macOS packages
  MOCK  the mock MCP server binary (tests/support/mock_server.rs)
  UVX   the uvx executable (uv's)

Each check runs a relay round trip (initialize, then a tools/call of the
mock's `echo`) and checks that no process is left behind. Through npx it
also checks that stdin's end and SIGTERM reach the binary, and that
`check` of a `.mcp.json` running `npx mcp-retry run` reports a dead server
in its own words despite a warm handshake cache; through the
launcher alone, that SIGTERM, SIGINT and SIGHUP do and the binary's status
is returned, that it ends by the signal that ended the binary, and its
error for a missing platform package. Exits non-zero on the first
failure. Knows nothing of how the packages are built.
"""

import base64
import glob
import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import macho  # noqa: E402

WAIT = 60  # seconds any one expectation may take (npm and uv start slowly)
CHECKS = 0


def fail(what):
    print(f"FAIL: {what}", file=sys.stderr)
    sys.exit(1)


def ok(what):
    global CHECKS
    CHECKS += 1
    print(f"ok: {what}", flush=True)


def run(cmd, **kw):
    """Runs cmd to the end; its CompletedProcess (text, output captured)."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT * 5, **kw)


def one(pattern):
    found = sorted(glob.glob(pattern))
    if len(found) != 1:
        fail(f"expected one file matching {pattern}, found {found}")
    return found[0]


class Session:
    """A command speaking NDJSON on its stdin/stdout, stderr kept."""

    def __init__(self, cmd, cwd=None, env=None):
        self.cmd = cmd
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, bufsize=1,
        )
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        self.stderr_done = threading.Thread(
            target=self._read, args=(self.proc.stderr, self.stderr.append), daemon=True)
        self.stderr_done.start()

    @staticmethod
    def _read(stream, put):
        for line in stream:
            put(line)
        put(None)

    def send(self, message):
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def answer(self, id):
        """The answer with this id (notifications before it are skipped)."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.fail_with(f"no answer {id} within {WAIT} s")
            if line is None:
                self.fail_with(f"stdout ended before answer {id}")
            message = json.loads(line)
            if message.get("id") == id:
                return message

    def round_trip(self):
        self.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "packages", "version": "1"}}})
        init = self.answer(1)
        if init.get("result", {}).get("serverInfo", {}).get("name") != "mock-mcp-server":
            self.fail_with(f"initialize answered {init}")
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "round trip"}}})
        call = self.answer(2)
        if "round trip" not in json.dumps(call.get("result")):
            self.fail_with(f"tools/call answered {call}")

    def wait(self):
        try:
            code = self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.fail_with(f"still running {WAIT} s later")
        self.stderr_done.join(WAIT)
        return code

    def close_stdin(self):
        self.proc.stdin.close()

    def fail_with(self, what):
        self.proc.kill()
        fail(f"{' '.join(map(str, self.cmd))}: {what}; its stderr:\n{''.join(self.stderr)}")


def processes_under(directory, by_arguments=True):
    """The pids of the processes whose executable is in `directory`, or (with
    by_arguments) whose command line names a file in it (node running the
    launcher, npx, its shell)."""
    prefix = str(directory) + "/"
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if exe.startswith(prefix) or (by_arguments and prefix in args):
                found.append(int(pid))
    return found


def no_process_left(directory, what):
    """Waits (bounded) for every process running from `directory` to end."""
    deadline = time.monotonic() + WAIT
    while (left := processes_under(directory)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        cmdlines = []
        for p in left:
            try:
                cmdlines.append(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" "))
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        fail(f"{what}: processes left behind: {cmdlines}")


def relay(cmd, tmp, what, cwd=None, env=None):
    """A round trip through `cmd run -- MOCK`, ended by closing stdin."""
    s = Session([*cmd, "run", "--", str(tmp / "mock-mcp-server")], cwd=cwd, env=env)
    s.round_trip()
    s.close_stdin()
    code = s.wait()
    if code != 0:
        s.fail_with(f"exited with {code} after stdin ended (expected 0)")
    no_process_left(tmp, what)
    ok(f"{what}: a relay round trip; stdin's end stops it (status 0), nothing left running")


def version(cmd, what, cwd=None, env=None):
    done = run([*cmd, "--version"], cwd=cwd, env=env)
    if done.returncode != 0 or not done.stdout.startswith("mcp-retry "):
        fail(f"{what} --version: status {done.returncode}, {done.stdout!r} {done.stderr!r}")
    ok(f"{what} --version: {done.stdout.strip()}")


def check_through_npx(app, tmp, binary):
    """A project's `.mcp.json` whose entry is `npx mcp-retry run` with
    `instant_start`, checked from another folder: up and its entry
    refreshed, then, with the cache warm, down in the server's words once
    the server dies."""
    dead = tmp / "dead"
    (app / "srv.yaml").write_text(
        "servers:\n  tiny:\n"
        f"    command: {tmp / 'mock-mcp-server'}\n"
        "    instant_start: true\n    env:\n"
        f"      MOCK_CRASH_IF_EXISTS: {json.dumps(str(dead))}\n"
        '      MOCK_CRASH_MESSAGE: "Error: TINY_API_KEY is not set"\n')
    (app / ".mcp.json").write_text(json.dumps({"mcpServers": {"tiny": {
        "command": "npx",
        "args": ["--no-install", "mcp-retry", "run", "--config", "srv.yaml"],
    }}}))
    env = dict(os.environ, MCP_RETRY_CACHE_DIR=str(tmp / "check-cache"))
    cmd = [str(binary), "check", "--config", str(app / ".mcp.json")]
    done = run(cmd, cwd=tmp, env=env)
    if done.returncode != 0 or not done.stdout.startswith("[UP  ] tiny") \
            or 'refreshed the entries of "tiny"' not in done.stderr:
        fail(f"check of npx mcp-retry: status {done.returncode}, {done.stdout!r} {done.stderr!r}")
    dead.write_text("")
    done = run(cmd, cwd=tmp, env=env)
    if done.returncode != 1 or not done.stdout.startswith("[DOWN] tiny") \
            or "Error: TINY_API_KEY is not set" not in done.stdout:
        fail(f"check of a dead server behind npx mcp-retry: status {done.returncode}, "
             f"{done.stdout!r} {done.stderr!r}")
    no_process_left(tmp, "check through npx mcp-retry")
    ok("check of .mcp.json through npx mcp-retry: down in the server's words despite a warm cache")


def npm_checks(dist, tmp):
    main = one(str(dist / "mcp-retry-[0-9]*.tgz"))
    platform = one(str(dist / "mcp-retry-linux-x64-[0-9]*.tgz"))
    app = tmp / "npm"
    app.mkdir()
    # Both by path: npm skips an optional dependency it cannot find.
    done = run(["npm", "install", "--no-audit", "--no-fund", main, platform], cwd=app)
    if done.returncode != 0:
        fail(f"npm install: {done.stdout}{done.stderr}")
    binary = app / "node_modules" / "@mcp-retry" / "linux-x64" / "bin" / "mcp-retry"
    if not os.access(binary, os.X_OK):
        fail(f"{binary} is not installed as an executable")
    ok("npm install of the launcher and @mcp-retry/linux-x64 tarballs")
    npx = ["npx", "--no-install", "mcp-retry"]
    version(npx, "npx mcp-retry", cwd=app)
    relay(npx, tmp, "npx mcp-retry", cwd=app)

    check_through_npx(app, tmp, binary)

    # SIGTERM to npx, as a host stops the command it started: the binary
    # gets it (its log says so), stops the server and nothing is left.
    s = Session([*npx, "run", "--", str(tmp / "mock-mcp-server")], cwd=app)
    s.round_trip()
    s.proc.send_signal(signal.SIGTERM)
    code = s.wait()
    no_process_left(tmp, "npx mcp-retry after SIGTERM")
    if not any("received signal 15" in line for line in s.stderr):
        s.fail_with("the binary did not log SIGTERM")
    ok(f"npx mcp-retry: SIGTERM reaches the binary (npx exits {code}), nothing left running")

    # The launcher itself: the binary's status is its status, and a signal
    # that ends the binary ends the launcher.
    launcher = [str(app / "node_modules" / ".bin" / "mcp-retry")]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        s = Session([*launcher, "run", "--", str(tmp / "mock-mcp-server")])
        s.round_trip()
        s.proc.send_signal(sig)
        if (code := s.wait()) != 128 + sig:
            s.fail_with(f"the launcher exited {code} on {sig.name}, not the binary's {128 + sig}")
        if not any(f"received signal {int(sig)}" in line for line in s.stderr):
            s.fail_with(f"the binary did not log {sig.name}")
        no_process_left(tmp, f"launcher after {sig.name}")
        ok(f"launcher: {sig.name} is passed on and the binary's status {128 + sig} returned")
    s = Session([*launcher, "run", "--", str(tmp / "mock-mcp-server")])
    s.round_trip()
    for pid in processes_under(binary.parent, by_arguments=False):
        os.kill(pid, signal.SIGKILL)
    if (code := s.wait()) != -signal.SIGKILL:
        s.fail_with(f"the launcher exited {code}, not by SIGKILL like the binary")
    no_process_left(tmp, "launcher after its binary was killed")
    ok("launcher: ends by the signal that ended the binary")

    # Without the platform package: an error naming the platform and the
    # other ways to install.
    bare = tmp / "npm-bare"
    bare.mkdir()
    done = run(["npm", "install", "--no-audit", "--no-fund", "--omit=optional", main], cwd=bare)
    if done.returncode != 0:
        fail(f"npm install --omit=optional: {done.stdout}{done.stderr}")
    done = run(npx + ["--version"], cwd=bare)
    if done.returncode == 0 or "@mcp-retry/linux-x64" not in done.stderr \
            or "linux-x64" not in done.stderr or "cargo install" not in done.stderr:
        fail(f"without the platform package: status {done.returncode}, {done.stderr!r}")
    ok("without @mcp-retry/linux-x64: " + done.stderr.splitlines()[0])


def python_checks(dist, tmp, uvx):
    wheel = one(str(dist / "mcp_retry_rs-*manylinux*x86_64*.whl"))
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)]).check_returncode()
    done = run([str(venv / "bin" / "pip"), "install", "--no-index", "-q", wheel])
    if done.returncode != 0:
        fail(f"pip install {wheel}: {done.stdout}{done.stderr}")
    ok(f"pip install {Path(wheel).name} into a fresh venv")
    command = [str(venv / "bin" / "mcp-retry")]
    version(command, "pip's mcp-retry")
    relay(command, tmp, "pip's mcp-retry")
    no_process_left(venv, "pip's mcp-retry")

    env = dict(os.environ, UV_CACHE_DIR=str(tmp / "uv-cache"), UV_TOOL_DIR=str(tmp / "uv-tools"),
               UV_PYTHON_DOWNLOADS="never", UV_OFFLINE="1", UV_NO_CONFIG="1")
    command = [uvx, "--from", wheel, "mcp-retry"]
    version(command, "uvx --from the wheel mcp-retry", env=env)
    relay(command, tmp, "uvx --from the wheel mcp-retry", env=env)
    no_process_left(tmp / "uv-cache", "uvx")


# npm package suffix, process.arch, Mach-O architecture, minimum macOS, wheel tag.
DARWIN = [
    ("darwin-arm64", "arm64", "arm64", "11.0", "macosx_11_0_arm64"),
    ("darwin-x64", "x64", "x86_64", "10.12", "macosx_10_12_x86_64"),
]


def darwin_checks(dist):
    with tarfile.open(one(str(dist / "mcp-retry-[0-9]*.tgz"))) as tgz:
        launcher = json.load(tgz.extractfile("package/package.json"))
    for suffix, cpu, arch, min_macos, tag in DARWIN:
        name = f"@mcp-retry/{suffix}"
        if name not in launcher.get("optionalDependencies", {}):
            fail(f"the launcher does not name {name} as an optional dependency")
        with tarfile.open(one(str(dist / f"mcp-retry-{suffix}-[0-9]*.tgz"))) as tgz:
            manifest = json.load(tgz.extractfile("package/package.json"))
            member = tgz.getmember("package/bin/mcp-retry")
            binary = tgz.extractfile(member).read()
        if manifest["name"] != name or manifest["os"] != ["darwin"] or manifest["cpu"] != [cpu]:
            fail(f"{name}: package.json names {manifest['name']}, os {manifest['os']}, cpu {manifest['cpu']}")
        if member.mode & 0o111 != 0o111:
            fail(f"{name}: bin/mcp-retry is not executable (mode {member.mode:o})")
        wheel = one(str(dist / f"mcp_retry_rs-*-{tag}.whl"))
        with zipfile.ZipFile(wheel) as whl:
            (script,) = [n for n in whl.namelist() if n.endswith(".data/scripts/mcp-retry")]
            carried = whl.read(script)
            (record,) = [n for n in whl.namelist() if n.endswith(".dist-info/RECORD")]
            lines = whl.read(record).decode().splitlines()
        if carried != binary:
            fail(f"{Path(wheel).name} and {name} carry different binaries")
        digest = base64.urlsafe_b64encode(hashlib.sha256(carried).digest()).rstrip(b"=").decode()
        if f"{script},sha256={digest},{len(carried)}" not in lines:
            fail(f"{Path(wheel).name}: RECORD does not match {script}")
        with tempfile.NamedTemporaryFile() as f:
            f.write(binary)
            f.flush()
            problems, b = macho.check(f.name, arch, min_macos)
        if problems:
            fail(f"{name}'s binary: {'; '.join(problems)}")
        ok(f"{name} and {Path(wheel).name}: the same {len(binary)} bytes, a Mach-O {arch} "
           f"executable for macOS {min_macos} or later, system libraries only, ad-hoc signed")


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    dist, mock, uvx = Path(argv[0]).resolve(), Path(argv[1]).resolve(), argv[2]
    with tempfile.TemporaryDirectory(prefix="mcp-retry-packages-") as t:
        tmp = Path(t)
        # Every mcp-retry started here keeps its state in `tmp`, never in
        # the user's directories.
        os.environ["MCP_RETRY_STATE_DIR"] = str(tmp / "state")
        os.environ["MCP_RETRY_RUNTIME_DIR"] = str(tmp / "runtime")
        os.environ.pop("MCP_RETRY_STORE", None)
        # A copy of its own, so the processes of this run are told apart by
        # their executable's path.
        shutil.copy2(mock, tmp / "mock-mcp-server")
        npm_checks(dist, tmp)
        python_checks(dist, tmp, uvx)
    darwin_checks(dist)
    print(f"{CHECKS} passed, 0 failed")


if __name__ == "__main__":
    main(sys.argv[1:])
