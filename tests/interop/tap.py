#!/usr/bin/env python3
"""A transparent line tap: `tap.py LOG -- COMMAND [ARGS...]`.

Runs COMMAND with our stdin/stdout relayed to its stdin/stdout unchanged, line
by line, and appends every line to LOG as one JSON object per line:
`{"dir": "in" | "out", "line": "<the exact text>"}` ("in" is what COMMAND
read, "out" what it wrote). COMMAND's stderr is ours. When our stdin closes,
COMMAND's stdin is closed; we exit with COMMAND's exit status.

The interop suite puts one tap in front of whatever the client launches (the
server, or mcp-retry) to see the client's side of the wire byte for byte, and
one between mcp-retry and the server to see what the server was sent.
Standard library only, so it runs under any Python 3.
"""
import json
import os
import signal
import subprocess
import sys
import threading


def main() -> int:
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.stderr.write("usage: tap.py LOG -- COMMAND [ARGS...]\n")
        return 2
    log_path, command = sys.argv[1], sys.argv[3:]
    log = open(log_path, "a", encoding="utf-8")
    lock = threading.Lock()

    def record(direction: str, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            log.write(json.dumps({"dir": direction, "line": text}) + "\n")
            log.flush()

    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    # Pass termination on to the child, as a launcher would; the child's exit
    # then ends us through the normal path.
    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)

    def pump_in() -> None:
        stdin = sys.stdin.buffer
        try:
            for raw in iter(stdin.readline, b""):
                record("in", raw)
                child.stdin.write(raw)
                child.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        finally:
            try:
                child.stdin.close()
            except OSError:
                pass

    def pump_out() -> None:
        stdout = sys.stdout.buffer
        try:
            for raw in iter(child.stdout.readline, b""):
                record("out", raw)
                stdout.write(raw)
                stdout.flush()
        except (BrokenPipeError, OSError):
            pass

    threading.Thread(target=pump_in, daemon=True).start()
    out = threading.Thread(target=pump_out, daemon=True)
    out.start()
    code = child.wait()
    out.join(timeout=2)
    log.close()
    try:
        sys.stdout.flush()
    except OSError:
        pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    status = main()
    # Skip interpreter teardown: the stdin pump may still block in a read.
    os._exit(status)
