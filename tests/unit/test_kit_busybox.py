"""The test kit refuses a dynamically linked busybox, which would make every container fail to exec /bin/sh."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.kit.busybox import PT_INTERP, STATIC_ROOT, elf_interpreter, require_static

PT_LOAD, PT_DYNAMIC = 1, 2


def synthetic_elf(path: Path, *, bits: int, endian: str, interp: bytes | None) -> Path:
    """A minimal ELF executable: a header, then program headers (PT_LOAD, and PT_INTERP when asked)."""
    header_format = endian + ("HHIIIIIHHHHHH" if bits == 32 else "HHIQQQIHHHHHH")
    entry_format = endian + ("IIIIIIII" if bits == 32 else "IIQQQQQQ")
    phoff = 16 + struct.calcsize(header_format)
    phentsize = struct.calcsize(entry_format)
    types = [PT_LOAD] + ([PT_INTERP] if interp is not None else [])
    data_at = phoff + phentsize * len(types)
    ident = b"\x7fELF" + bytes([1 if bits == 32 else 2, 1 if endian == "<" else 2, 1]) + bytes(9)
    header = struct.pack(header_format, 2, 62, 1, 0, phoff, 0, 0, 16 + struct.calcsize(header_format),
                         phentsize, len(types), 0, 0, 0)
    entries = b""
    for p_type in types:
        size = len(interp) if p_type == PT_INTERP and interp is not None else 0
        if bits == 32:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
            entries += struct.pack(entry_format, p_type, data_at, 0, 0, size, size, 4, 1)
        else:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
            entries += struct.pack(entry_format, p_type, 4, data_at, 0, 0, size, size, 1)
    path.write_bytes(ident + header + entries + (interp or b""))
    return path


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("endian", ["<", ">"])
def test_synthetic_binaries(tmp_path: Path, bits: int, endian: str) -> None:
    static = synthetic_elf(tmp_path / "static", bits=bits, endian=endian, interp=None)
    dynamic = synthetic_elf(tmp_path / "dynamic", bits=bits, endian=endian, interp=b"/lib/ld-musl.so.1\0")
    assert elf_interpreter(static) is None
    assert elf_interpreter(dynamic) == "/lib/ld-musl.so.1"
    assert require_static(static) == static


def test_host_dynamic_binary_is_refused() -> None:
    assert elf_interpreter(Path("/bin/ls")) is not None
    with pytest.raises(RuntimeError, match=r"^/bin/ls is dynamically linked \(it needs /lib.*ld-linux"):
        require_static(Path("/bin/ls"))


def test_static_pie_counts_as_static() -> None:
    """Debian's ldconfig is static-pie: PT_DYNAMIC but no loader, and it runs in an empty rootfs."""
    assert elf_interpreter(Path("/sbin/ldconfig")) is None


def test_not_elf(tmp_path: Path) -> None:
    script = tmp_path / "sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ValueError, match="not an ELF file"):
        elf_interpreter(script)


def test_cached_busybox_is_static() -> None:
    binary = STATIC_ROOT / "bin" / "busybox"
    if not binary.exists():
        pytest.skip("busybox-static not fetched yet (make setup fetches it)")
    assert require_static(binary) == binary
