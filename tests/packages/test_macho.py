"""Tests of macho.py on the signed macOS release binaries (`make darwin` runs
them with MACHO_TEST_BINARY naming its arm64 one and MACHO_TEST_BINARY_X86_64
its Intel one): they pass as built, and each check fails on a copy changed in
the one place it looks at."""

import os
import struct
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import macho  # noqa: E402


def commands(data):
    """(cmd, offset, size) of each load command."""
    ncmds = struct.unpack_from("<I", data, 16)[0]
    offset, found = 32, []
    for _ in range(ncmds):
        cmd, size = struct.unpack_from("<2I", data, offset)
        found.append((cmd, offset, size))
        offset += size
    return found


class MachO(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        path = os.environ.get("MACHO_TEST_BINARY")
        if not path:
            raise RuntimeError("MACHO_TEST_BINARY names no signed arm64 binary")
        cls.original = Path(path).read_bytes()

    def setUp(self):
        self.data = bytearray(self.original)

    def problems(self, arch="arm64", min_macos="11.0"):
        with tempfile.NamedTemporaryFile() as f:
            f.write(self.data)
            f.flush()
            return macho.check(f.name, arch, min_macos)[0]

    def assertProblem(self, text, **kw):
        problems = self.problems(**kw)
        self.assertTrue(any(text in p for p in problems), f"no {text!r} in {problems}")

    def test_the_signed_binary_passes(self):
        self.assertEqual(self.problems(), [])

    def test_another_architecture_is_refused(self):
        self.assertProblem("built for arm64, not x86_64", arch="x86_64")

    def test_a_changed_code_page_breaks_the_signature(self):
        self.data[len(self.data) // 3] ^= 0xFF
        self.assertProblem("pages do not match their hash")

    def test_a_higher_minimum_macos_is_refused(self):
        (offset,) = [o for c, o, _ in commands(self.data) if c == macho.LC_BUILD_VERSION]
        struct.pack_into("<I", self.data, offset + 12, 14 << 16)
        self.assertProblem("needs macOS 14.0, not 11.0")

    def test_a_library_outside_the_system_is_refused(self):
        lib = b"/usr/lib/libiconv.2.dylib"
        at = self.data.index(lib)
        homebrew = b"/opt/homebrew/lib/libiconv.dylib"[: len(lib)]
        self.data[at : at + len(lib)] = homebrew
        self.assertProblem(f"links {homebrew.decode()}, not a system library")

    def test_a_signature_that_is_not_ad_hoc_is_refused(self):
        (dataoff, _) = [
            struct.unpack_from("<2I", self.data, o + 8)
            for c, o, _ in commands(self.data) if c == macho.LC_CODE_SIGNATURE
        ][0]
        cd = self.data.index(struct.pack(">I", macho.CSMAGIC_CODEDIRECTORY), dataoff)
        flags = struct.unpack_from(">I", self.data, cd + 12)[0]
        struct.pack_into(">I", self.data, cd + 12, flags & ~macho.CS_ADHOC)
        self.assertProblem("not ad hoc")

    def test_an_unsigned_binary_is_refused(self):
        for cmd, offset, _ in commands(self.data):
            if cmd == macho.LC_CODE_SIGNATURE:
                struct.pack_into("<I", self.data, offset, 0x7FFFFFF0)  # an unknown command
        self.assertProblem("is not signed")

    def test_the_intel_binary_and_its_minimum_version_command(self):
        # The x86_64 binary states its minimum in LC_VERSION_MIN_MACOSX.
        self.data = bytearray(Path(os.environ["MACHO_TEST_BINARY_X86_64"]).read_bytes())
        self.assertEqual(self.problems(arch="x86_64", min_macos="10.12"), [])
        (offset,) = [o for c, o, _ in commands(self.data) if c == macho.LC_VERSION_MIN_MACOSX]
        struct.pack_into("<I", self.data, offset + 8, (10 << 16) | (15 << 8))
        self.assertProblem("needs macOS 10.15, not 10.12", arch="x86_64", min_macos="10.12")

    def test_a_universal_file_is_refused(self):
        struct.pack_into(">I", self.data, 0, macho.FAT_MAGIC)
        self.assertProblem("universal (fat) file")


if __name__ == "__main__":
    unittest.main()
