"""The installed llama.cpp build runs wherever its cached wheel is reused: no instructions beyond the portable
x86-64 baseline (AVX2/FMA/F16C), so a wheel built on a machine with AVX-512 or AMX never dies with SIGILL
on a machine without them. Skipped when llama-cpp-python is not installed, on other architectures, or without
binutils' objdump."""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SPEC = importlib.util.find_spec("llama_cpp")
if SPEC is None or SPEC.origin is None:
    pytest.skip("llama-cpp-python is not installed", allow_module_level=True)
if platform.machine() not in ("x86_64", "AMD64"):
    pytest.skip("the instruction check reads x86-64 code", allow_module_level=True)
OBJDUMP = shutil.which("objdump")
if OBJDUMP is None:
    pytest.skip("objdump (binutils) is not installed", allow_module_level=True)

LIB = Path(SPEC.origin).parent / "lib"
# AVX-512 code names zmm or opmask (k0-k7) registers; AMX code uses the tile instructions.
BEYOND_BASELINE = re.compile(r"%zmm\d|%k[0-7]\b|\btile(zero|loadd|stored|release)\b|\btdpb")


def test_the_cpu_backend_uses_no_instruction_beyond_the_portable_baseline() -> None:
    libraries = sorted(p for p in LIB.glob("libggml-cpu*.so*") if not p.is_symlink())
    assert libraries, f"no libggml-cpu library under {LIB}"
    for library in libraries:
        listing = subprocess.run([OBJDUMP, "-d", "--no-show-raw-insn", str(library)], capture_output=True,
                                 text=True, timeout=300, check=True).stdout
        assert "%ymm" in listing, f"{library.name}: no AVX2 code at all; is this the baseline build?"
        found = sorted({m.group(0) for m in BEYOND_BASELINE.finditer(listing)})
        assert not found, (f"{library.name} uses {found[:5]}: it was built for this CPU's native instructions; "
                           "rebuild it with `make rebuild-llama`")
