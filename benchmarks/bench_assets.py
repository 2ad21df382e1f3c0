"""Streaming asset write throughput against a raw baseline measured in the same run; prints the ratio.

`put_asset` streams a 64 MiB asset from an iterator of 1 MiB chunks: locked
temporary file, SHA-256, cap check, write, fsync, no-clobber hard link,
directory fsync and the catalog transaction. The baseline writes the same
bytes from the same chunks with SHA-256, `os.write` and one fsync into a new
file in the same folder. Rounds alternate the two sides (each round's content
differs, so nothing is deduplicated) and the median throughput ratio
(baseline time / ours) is printed; the target is at least 0.8.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results import Figures, render_list

from emelex_memory import MemoryStore, Settings

MiB = 1024 * 1024
ASSET_MIB = 64
ROUNDS = 11
TARGET = 0.8
ABOUT = f"""\
A {ASSET_MIB} MiB asset streamed through `put_asset` against SHA-256 + `os.write` + fsync of the same chunks into
a new file in the same folder, {ROUNDS} alternating rounds, median throughput ratio (baseline time / ours).
(What is measured: [docs/assets.md](../docs/assets.md#benchmark).)
"""
SECTIONS = ("assets",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_memory/assets",
    "emelex_memory/core",
)


def render(figures: dict) -> str:
    """The `assets` section of the recorded `figures`."""
    return render_list("Assets (`bench_assets.py`)", ABOUT, figures)


FIGURES = Figures("assets", render)


def _chunks(block: bytes, round_no: int):
    yield bytes([round_no]) + block[1:]
    for _ in range(ASSET_MIB - 1):
        yield block


def _raw_write(folder: Path, block: bytes, round_no: int) -> str:
    path = folder / f"raw-{round_no}"
    hasher = hashlib.sha256()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for chunk in _chunks(block, round_no):
            hasher.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def bench_put(root: Path) -> float:
    store = MemoryStore.open_path(root / "assets.sqlite3", Settings(home=root / "home"))
    store.put_asset(b"warm up", "text/plain")
    block = os.urandom(MiB)
    ratios, ours_s = [], []
    for round_no in range(ROUNDS):
        sides = {}
        for side in ("raw", "ours") if round_no % 2 == 0 else ("ours", "raw"):  # alternate who goes first
            t0 = time.perf_counter()
            if side == "raw":
                digest = _raw_write(store.asset_dir, block, round_no)
            else:
                ref = store.put_asset(_chunks(block, round_no), "application/octet-stream")
                digest = ref.digest
            sides[side] = (time.perf_counter() - t0, digest)
        assert sides["raw"][1] == sides["ours"][1]
        ratios.append(sides["raw"][0] / sides["ours"][0])
        ours_s.append(sides["ours"][0])
        os.unlink(store.asset_dir / f"raw-{round_no}")  # keep the disk footprint flat; not timed
        store.collect_assets(grace_s=0)
    ratio = statistics.median(ratios)
    FIGURES.add(f"put_asset of {ASSET_MIB} MiB (streamed) vs raw SHA-256 + write + fsync: throughput ratio", ratio,
                ">=", TARGET, detail=f"rounds: {', '.join(f'{r:.2f}' for r in ratios)}; "
                f"ours {ASSET_MIB / statistics.median(ours_s):.0f} MiB/s")
    store.close()
    return ratio


def main() -> int:
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".bench-") as tmp:
        root = Path(tmp)
        root.chmod(0o700)
        bench_put(root)
    return FIGURES.write()


if __name__ == "__main__":
    sys.exit(main())
