"""An export streams: its memory stays bounded by a page and a line, not by the store's size, and it reports its
progress (on a terminal, `emelex memory export` draws it on stderr)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from emelex_memory import ImportedEvent, ImportSource, MemoryStore, Settings
from emelex_workers.interop.export_file import write_export

EVENTS = 20_000
TEXT = "a line of a long conversation, kept to be exported " * 20  # about 1 KiB an event: 20 MiB in all


def test_an_export_holds_a_page_not_the_store_and_reports_progress(tmp_path: Path, workspace: Path) -> None:
    with MemoryStore.open(Settings(home=tmp_path / "home")) as store:
        source = ImportSource("jsonl", "big", str(tmp_path / "big.jsonl"), 1, EVENTS, 1, "0" * 64)
        store.import_history(workspace, source, (ImportedEvent("user", {"text": f"{i} {TEXT}"}, float(i), True)
                                                 for i in range(EVENTS)), planned_from=None, distill=False)
        seen: list[tuple[str, int, int]] = []
        tracemalloc.start()
        try:
            report = write_export(store, str(tmp_path / "out.jsonl"), lambda *p: seen.append(p))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    size = (tmp_path / "out.jsonl").stat().st_size
    assert report.counts["events"] == EVENTS and size > 20 * 1024 * 1024
    assert peak < 4 * 1024 * 1024, f"exporting {size} bytes held {peak} bytes at its peak"
    assert ("events", EVENTS, EVENTS) in seen and seen[0] == ("sessions", 1, 1)
