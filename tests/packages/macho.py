#!/usr/bin/env python3
"""Checks a macOS release binary of mcp-retry the way this Linux machine
can, without running it: its Mach-O header, architecture, minimum macOS
version, the libraries it links, and its ad-hoc code signature, whose
hashes are computed again over the file.

Usage: macho.py ARCH MIN_MACOS BINARY...
  ARCH       arm64 or x86_64
  MIN_MACOS  the lowest macOS it must run on, e.g. 11.0 (arm64), 10.12 (x86_64)

Checks, for each BINARY:
- a thin 64-bit Mach-O executable (MH_EXECUTE, position independent) for ARCH;
- LC_BUILD_VERSION (or LC_VERSION_MIN_MACOSX) for macOS, with a minimum
  version of MIN_MACOS exactly: a higher one would not start on the systems
  its wheel tag and npm package promise;
- every dylib it loads is the system's (/usr/lib/ or
  /System/Library/Frameworks/), never one a package manager installs
  (/opt/homebrew, /usr/local, @rpath...), and it has no LC_RPATH;
- an embedded signature (LC_CODE_SIGNATURE) in __LINKEDIT whose
  CodeDirectory is ad hoc (no certificate, as Apple Silicon needs at least),
  hashes with SHA-256 every page up to the signature itself, and whose
  code and special-slot hashes (requirements, entitlements) match the file.

Prints one line per binary; exits 1 and names every problem found otherwise.
The Mach-O structures are read here (a page of `struct` unpacking) rather
than with macholib or lief: neither verifies a code signature's hashes,
which is the check that matters, and the rest is a few fixed layouts from
<mach-o/loader.h> and <Kernel/kern/cs_blobs.h>. Knows nothing of how the
binary is built or signed.
"""

import hashlib
import struct
import sys

MH_MAGIC_64 = 0xFEEDFACF
FAT_MAGIC = 0xCAFEBABE
MH_EXECUTE = 2
MH_PIE = 0x200000
CPU_TYPES = {"x86_64": 0x01000007, "arm64": 0x0100000C}

LC_SEGMENT_64 = 0x19
LC_CODE_SIGNATURE = 0x1D
LC_VERSION_MIN_MACOSX = 0x24
LC_BUILD_VERSION = 0x32
LC_RPATH = 0x8000001C
# Each command that loads a dylib (dylib_command: its name at an offset).
DYLIB_COMMANDS = {
    0x0C: "LC_LOAD_DYLIB",
    0x20: "LC_LAZY_LOAD_DYLIB",
    0x80000018: "LC_LOAD_WEAK_DYLIB",
    0x8000001F: "LC_REEXPORT_DYLIB",
    0x80000023: "LC_LOAD_UPWARD_DYLIB",
}
PLATFORM_MACOS = 1
SYSTEM_PREFIXES = ("/usr/lib/", "/System/Library/Frameworks/")

# Code signing blobs (big-endian).
CSMAGIC_EMBEDDED_SIGNATURE = 0xFADE0CC0
CSMAGIC_CODEDIRECTORY = 0xFADE0C02
CSSLOT_CODEDIRECTORY = 0
CSSLOT_ALTERNATE_CODEDIRECTORIES = 0x1000
CS_ADHOC = 0x2
CS_HASHTYPE_SHA256 = 2


def version(v):
    """An X.Y.Z nibble-packed version (xxxx.yy.zz) as text, zero patch left out."""
    major, minor, patch = v >> 16, (v >> 8) & 0xFF, v & 0xFF
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


def cstring(data, start, end):
    """The NUL-terminated string at data[start:end]."""
    return data[start:end].split(b"\0", 1)[0].decode("utf-8", "replace")


class Binary:
    """What the checks read from one Mach-O file: facts and problems."""

    def __init__(self, data):
        self.data = data
        self.problems = []
        self.arch = None
        self.min_macos = None
        self.dylibs = []
        self.rpaths = []
        self.signature = None  # (offset, size) from LC_CODE_SIGNATURE
        self.linkedit = None  # (fileoff, filesize) of __LINKEDIT
        self.identifier = None
        self.flags = None
        self._read_commands()
        if self.signature:
            self._read_signature()

    def problem(self, text):
        self.problems.append(text)

    def _read_commands(self):
        data = self.data
        if len(data) < 32:
            self.problem("too short for a Mach-O header")
            return
        magic, cputype, _, filetype, ncmds, sizeofcmds, flags, _ = struct.unpack_from("<8I", data)
        if magic == FAT_MAGIC or struct.unpack_from(">I", data)[0] == FAT_MAGIC:
            self.problem("a universal (fat) file, not one architecture's binary")
            return
        if magic != MH_MAGIC_64:
            self.problem(f"not a 64-bit Mach-O file (magic {magic:#x})")
            return
        names = {v: k for k, v in CPU_TYPES.items()}
        self.arch = names.get(cputype, f"cputype {cputype:#x}")
        if filetype != MH_EXECUTE:
            self.problem(f"file type {filetype}, not an executable (MH_EXECUTE)")
        if not flags & MH_PIE:
            self.problem("not position independent (no MH_PIE)")
        if 32 + sizeofcmds > len(data):
            self.problem("its load commands run past the end of the file")
            return
        offset = 32
        for _ in range(ncmds):
            cmd, size = struct.unpack_from("<2I", data, offset)
            if size < 8 or offset + size > 32 + sizeofcmds:
                self.problem(f"a load command ({cmd:#x}) with a bad size {size}")
                return
            self._command(cmd, offset, size)
            offset += size

    def _command(self, cmd, offset, size):
        data = self.data
        if cmd == LC_BUILD_VERSION:
            platform, minos = struct.unpack_from("<2I", data, offset + 8)
            if platform != PLATFORM_MACOS:
                self.problem(f"built for platform {platform}, not macOS ({PLATFORM_MACOS})")
            self.min_macos = version(minos)
        elif cmd == LC_VERSION_MIN_MACOSX:
            self.min_macos = version(struct.unpack_from("<I", data, offset + 8)[0])
        elif cmd in DYLIB_COMMANDS:
            name = struct.unpack_from("<I", data, offset + 8)[0]
            self.dylibs.append(cstring(data, offset + name, offset + size))
        elif cmd == LC_RPATH:
            path = struct.unpack_from("<I", data, offset + 8)[0]
            self.rpaths.append(cstring(data, offset + path, offset + size))
        elif cmd == LC_CODE_SIGNATURE:
            self.signature = struct.unpack_from("<2I", data, offset + 8)
        elif cmd == LC_SEGMENT_64:
            name = cstring(data, offset + 8, offset + 24)
            if name == "__LINKEDIT":
                fileoff, filesize = struct.unpack_from("<2Q", data, offset + 40)
                self.linkedit = (fileoff, filesize)

    def _read_signature(self):
        data = self.data
        start, size = self.signature
        if start + size > len(data):
            self.problem("the code signature runs past the end of the file")
            return
        if not self.linkedit or not (
            self.linkedit[0] <= start and start + size <= sum(self.linkedit)
        ):
            self.problem("the code signature is not inside __LINKEDIT")
        blob = data[start : start + size]
        magic, length, count = struct.unpack_from(">3I", blob)
        if magic != CSMAGIC_EMBEDDED_SIGNATURE or length > size:
            self.problem(f"the code signature is not an embedded signature (magic {magic:#x})")
            return
        slots = {}
        for i in range(count):
            kind, off = struct.unpack_from(">2I", blob, 12 + 8 * i)
            slot_magic, slot_length = struct.unpack_from(">2I", blob, off)
            slots[kind] = blob[off : off + slot_length]
        directories = [
            b for k, b in slots.items()
            if k == CSSLOT_CODEDIRECTORY or CSSLOT_ALTERNATE_CODEDIRECTORIES <= k < 0x1005
        ]
        sha256 = [d for d in directories if d[37] == CS_HASHTYPE_SHA256]
        if not sha256:
            self.problem("the signature has no SHA-256 CodeDirectory")
            return
        self._check_directory(sha256[0], slots, start)

    def _check_directory(self, cd, slots, signature_start):
        (magic, _, _, flags, hash_offset, ident_offset, n_special, n_code, code_limit,
         hash_size, _, _, page_log2) = struct.unpack_from(">9I4B", cd)
        if magic != CSMAGIC_CODEDIRECTORY:
            self.problem(f"a CodeDirectory with magic {magic:#x}")
            return
        self.flags = flags
        self.identifier = cstring(cd, ident_offset, len(cd))
        if not flags & CS_ADHOC:
            self.problem(f"the signature is not ad hoc (flags {flags:#x})")
        if code_limit != signature_start:
            self.problem(
                f"the signature covers {code_limit} bytes, not all {signature_start} before it")
        page = 1 << page_log2 if page_log2 else code_limit
        if n_code != -(-code_limit // page):
            self.problem(f"{n_code} page hashes for {code_limit} bytes in pages of {page}")
        bad = []
        for i in range(n_code):
            want = cd[hash_offset + i * hash_size : hash_offset + (i + 1) * hash_size]
            got = hashlib.sha256(self.data[i * page : min((i + 1) * page, code_limit)]).digest()
            if got[:hash_size] != want:
                bad.append(i)
        if bad:
            self.problem(f"{len(bad)} of {n_code} pages do not match their hash (first: {bad[0]})")
        # Special slots: -N is at hash_offset - N * hash_size; each blob
        # present in the signature (requirements 2, entitlements 5 and 7)
        # must match it.
        for kind in range(1, n_special + 1):
            want = cd[hash_offset - kind * hash_size : hash_offset - (kind - 1) * hash_size]
            if kind in slots:
                if hashlib.sha256(slots[kind]).digest()[:hash_size] != want:
                    self.problem(f"special slot {kind} does not match its blob")
            elif kind in (2, 5, 7) and any(want):
                self.problem(f"special slot {kind} has a hash but no blob")


def check(path, arch, min_macos):
    """The problems of the binary at `path` (empty when it passes) and its facts."""
    with open(path, "rb") as f:
        b = Binary(f.read())
    if b.problems and b.arch is None:
        return b.problems, b
    if b.arch != arch:
        b.problem(f"built for {b.arch}, not {arch}")
    if b.min_macos is None:
        b.problem("no minimum macOS version (LC_BUILD_VERSION)")
    elif b.min_macos != min_macos:
        b.problem(f"needs macOS {b.min_macos}, not {min_macos}")
    if not b.dylibs:
        b.problem("links no library (libSystem is expected)")
    for lib in b.dylibs:
        if not lib.startswith(SYSTEM_PREFIXES):
            b.problem(f"links {lib}, not a system library")
    if "/usr/lib/libSystem.B.dylib" not in b.dylibs:
        b.problem("does not link /usr/lib/libSystem.B.dylib")
    for rpath in b.rpaths:
        b.problem(f"has a run path (LC_RPATH) {rpath}")
    if b.signature is None:
        b.problem("is not signed (no LC_CODE_SIGNATURE)")
    return b.problems, b


def main(argv):
    if len(argv) < 3 or argv[0] not in CPU_TYPES:
        sys.exit(__doc__)
    arch, min_macos = argv[0], argv[1]
    failed = False
    for path in argv[2:]:
        problems, b = check(path, arch, min_macos)
        if problems:
            failed = True
            for p in problems:
                print(f"macho.py: {path}: {p}", file=sys.stderr)
        else:
            print(f"{path}: Mach-O {b.arch} executable, macOS {b.min_macos} or later, "
                  f"links {', '.join(b.dylibs)}, ad-hoc signed as {b.identifier!r} "
                  f"(flags {b.flags:#x})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
