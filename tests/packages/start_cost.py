#!/usr/bin/env python3
"""What the npm launcher costs at start: `--version` run N times each as the
bare binary, as the launcher run by node, as `npx mcp-retry` in a directory
where it is installed (warm: npx finds it at once), and N/4 times as
`npx -y --package <tarballs> mcp-retry` with an empty npm cache (cold: npx
installs the two tarballs first, as `npx -y mcp-retry@X.Y.Z` does on a
host's first start, less the download). Prints
the median and the spread in milliseconds, as a Markdown table for
BENCHMARKS.md. Not part of CI (timings are not asserted anywhere).

Usage: start_cost.py DIR [N]   (DIR has the tarballs `make packages` makes)
"""

import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd, cwd, env=None):
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - started) * 1000


def main(argv):
    if not argv:
        sys.exit(__doc__)
    dist = Path(argv[0]).resolve()
    n = int(argv[1]) if len(argv) > 1 else 20
    main_tgz = glob.glob(str(dist / "mcp-retry-[0-9]*.tgz"))[0]
    platform_tgz = glob.glob(str(dist / "mcp-retry-linux-x64-[0-9]*.tgz"))[0]
    rows = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        # Every mcp-retry started here keeps its state in `tmp`, never in
        # the user's directories.
        os.environ["MCP_RETRY_STATE_DIR"] = str(tmp / "state")
        os.environ["MCP_RETRY_RUNTIME_DIR"] = str(tmp / "runtime")
        os.environ.pop("MCP_RETRY_STORE", None)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", main_tgz, platform_tgz],
                       cwd=tmp, check=True, capture_output=True)
        binary = tmp / "node_modules/@mcp-retry/linux-x64/bin/mcp-retry"
        launcher = tmp / "node_modules/mcp-retry/bin/mcp-retry.js"
        host = ["npx", "-y", "--package", main_tgz, "--package", platform_tgz, "mcp-retry"]
        for what, cmd in [
            ("the binary", [str(binary)]),
            ("node + the launcher", ["node", str(launcher)]),
            ("`npx mcp-retry`, installed in the directory", ["npx", "mcp-retry"]),
        ]:
            timed([*cmd, "--version"], tmp)
            rows.append((what, [timed([*cmd, "--version"], tmp) for _ in range(n)]))
        cold = []
        for i in range(max(3, n // 4)):
            env = dict(os.environ, npm_config_cache=str(tmp / f"cache{i}"))
            other = tmp / f"other{i}"
            other.mkdir()
            cold.append(timed([*host, "--version"], other, env))
        rows.append(("`npx -y --package <tarballs> mcp-retry`, cold (empty npm cache)", cold))
    print("| `--version` run as | median | min–max | runs |")
    print("| --- | ---: | ---: | ---: |")
    for what, ms in rows:
        print(f"| {what} | {statistics.median(ms):.1f} ms | {min(ms):.1f}–{max(ms):.1f} ms | {len(ms)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
