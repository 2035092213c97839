#!/usr/bin/env python3
"""The npm packages and Python wheels of prebuilt mcp-retry binaries.

Usage: pack.py [--sdist] OUT MATURIN TARGET=BINARY...
  OUT     the directory the packages go to
  MATURIN the maturin executable
  TARGET  a Rust target (x86_64-unknown-linux-musl, aarch64-unknown-linux-musl,
          aarch64-apple-darwin, x86_64-apple-darwin, x86_64-pc-windows-gnu),
          BINARY the release mcp-retry built for it

npm: `mcp-retry` (the launcher, packaging/npm/mcp-retry), which names every
platform package as an optional dependency, and one `@mcp-retry/<platform>`
package per binary given, each made with `npm pack`, all with the crate's
version (Cargo.toml).

Python: one wheel per binary, by maturin (pyproject.toml), Linux ones tagged
both manylinux2014 and musllinux_1_2 (the binaries are static), macOS ones
by maturin's default deployment targets (macosx_11_0_arm64,
macosx_10_12_x86_64). maturin runs cargo for the target, which finds the
release build that made BINARY up to date and builds nothing (given the same
environment, e.g. the target's CC; for macOS, `maturin --zig`, as the build
was); the wheel must carry BINARY byte for byte, except that a macOS binary
is signed after cargo built it: the wheel's unsigned copy is replaced by
BINARY (and its RECORD line). --sdist adds the source distribution.

Prints the path of each file made. Knows nothing of how the binaries are
built or tested.
"""

import base64
import hashlib
import json
import os
import time
import zipfile
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NPM = os.environ.get("NPM", "npm")

# Rust target -> (npm platform package suffix, process.platform, process.arch).
PLATFORMS = {
    "x86_64-unknown-linux-musl": ("linux-x64", "linux", "x64"),
    "aarch64-unknown-linux-musl": ("linux-arm64", "linux", "arm64"),
    "aarch64-apple-darwin": ("darwin-arm64", "darwin", "arm64"),
    "x86_64-apple-darwin": ("darwin-x64", "darwin", "x64"),
    "x86_64-pc-windows-gnu": ("win32-x64", "win32", "x64"),
}


def cargo_field(name):
    text = (ROOT / "Cargo.toml").read_text()
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    return re.search(rf'^{name} = "([^"]*)"', package, re.M).group(1)


def common(version):
    return {
        "version": version,
        "license": cargo_field("license"),
        "repository": {"type": "git", "url": "git+" + cargo_field("repository") + ".git"},
        "homepage": cargo_field("repository") + "#readme",
    }


def pack(stage, out):
    """`npm pack` of the package in `stage`; the .tgz's path."""
    done = subprocess.run(
        [NPM, "pack", "--json", "--pack-destination", str(out)],
        cwd=stage, check=True, capture_output=True, text=True,
    )
    return out / json.loads(done.stdout)[0]["filename"]


def platform_package(target, binary, version, stage, out):
    suffix, os_name, cpu = PLATFORMS[target]
    exe = "mcp-retry.exe" if os_name == "win32" else "mcp-retry"
    (stage / "bin").mkdir(parents=True)
    shutil.copyfile(binary, stage / "bin" / exe)
    (stage / "bin" / exe).chmod(0o755)
    shutil.copyfile(ROOT / "LICENSE", stage / "LICENSE")
    name = f"@mcp-retry/{suffix}"
    (stage / "README.md").write_text(
        f"# {name}\n\nThe mcp-retry binary for {os_name} on {cpu} ({target}).\n"
        "Install the `mcp-retry` package, which runs it: `npx -y mcp-retry --help`.\n"
    )
    manifest = {
        "name": name,
        "description": f"The mcp-retry binary for {os_name}-{cpu}",
        **common(version),
        "os": [os_name],
        "cpu": [cpu],
        "files": [f"bin/{exe}"],
        "preferUnplugged": True,
    }
    (stage / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return pack(stage, out)


def launcher_package(version, stage, out):
    src = ROOT / "packaging" / "npm" / "mcp-retry"
    shutil.copytree(src, stage)
    shutil.copyfile(ROOT / "LICENSE", stage / "LICENSE")
    manifest = {
        "name": "mcp-retry",
        "description": cargo_field("description"),
        **common(version),
        "keywords": ["mcp", "model-context-protocol", "proxy", "retry", "circuit-breaker"],
        "bin": {"mcp-retry": "bin/mcp-retry.js"},
        "files": ["bin/mcp-retry.js"],
        "engines": {"node": ">=18"},
        "optionalDependencies": {
            f"@mcp-retry/{suffix}": version for suffix, _, _ in PLATFORMS.values()
        },
    }
    (stage / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return pack(stage, out)


def maturin(maturin, *args):
    """Runs maturin on this crate; the path of the file it built."""
    done = subprocess.run(
        [maturin, *args, "--manifest-path", str(ROOT / "Cargo.toml")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    sys.stderr.write(done.stdout)
    if done.returncode != 0:
        sys.exit(f"pack.py: maturin {' '.join(args)} failed")
    built = [line for line in done.stdout.splitlines() if " to " in line and "Built" in line]
    if not built:
        sys.exit(f"pack.py: maturin {' '.join(args)} named no file")
    return Path(built[-1].rsplit(" to ", 1)[1].strip())


def replace_in_wheel(path, name, data):
    """Writes the wheel at `path` again with `data` as its file `name` and
    that file's line in RECORD (hash and size) to match."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rewritten = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(rewritten, "w") as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == name:
                body = data
            elif info.filename.endswith(".dist-info/RECORD"):
                lines = [
                    f"{name},sha256={digest},{len(data)}" if line.split(",", 1)[0] == name else line
                    for line in body.decode().splitlines()
                ]
                body = ("\n".join(lines) + "\n").encode()
            dst.writestr(info, body)
    rewritten.replace(path)


def wheel(maturin_bin, target, binary, out):
    started = time.monotonic()
    if "linux" in target:
        options = ["--compatibility", "manylinux2014", "musllinux_1_2"]
    elif "apple" in target:
        # As `make darwin` built it (found up to date): no `redis-tls`.
        options = ["--zig", "--no-default-features", "--features", "tls"]
    else:
        options = []
    path = maturin(maturin_bin, "build", "--release", "--target", target, *options, "--out", str(out))
    seconds = time.monotonic() - started
    exe = "mcp-retry.exe" if "windows" in target else "mcp-retry"
    data = Path(binary).read_bytes()
    with zipfile.ZipFile(path) as whl:
        inside = [n for n in whl.namelist() if n.endswith(f".data/scripts/{exe}")]
        carried = whl.read(inside[0]) if len(inside) == 1 else None
    if carried is None:
        sys.exit(f"pack.py: {path.name} has no {exe}")
    if carried != data:
        if "apple" not in target:
            sys.exit(f"pack.py: {path.name} does not carry {binary}")
        replace_in_wheel(path, inside[0], data)
    print(f"pack.py: {path.name} in {seconds:.1f} s", file=sys.stderr)
    return path


def main(argv):
    sdist = argv[:1] == ["--sdist"]
    argv = argv[1:] if sdist else argv
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        sys.exit(__doc__)
    out, maturin_bin = Path(argv[0]).resolve(), argv[1]
    out.mkdir(parents=True, exist_ok=True)
    version = cargo_field("version")
    targets = [arg.split("=", 1) for arg in argv[2:]]
    for target, _ in targets:
        if target not in PLATFORMS:
            sys.exit(f"pack.py: no packages for {target}")
    with tempfile.TemporaryDirectory() as tmp:
        made = [launcher_package(version, Path(tmp) / "mcp-retry", out)]
        for target, binary in targets:
            made.append(platform_package(target, binary, version, Path(tmp) / target, out))
    made += [wheel(maturin_bin, target, binary, out) for target, binary in targets]
    if sdist:
        made.append(maturin(maturin_bin, "sdist", "--out", str(out)))
    for path in made:
        print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
