"""A SIGKILL during an import leaves no half Session: a real `emelex memory import` process is killed while its
run's transaction is writing (its pages already spilling into the WAL), and the store then holds nothing of that
run; importing again brings the whole file in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from emelex_memory import MemoryStore, Settings

from ...support import table_rows

EMELEX = str(Path(sys.executable).parent / "emelex")
LINES = 60_000
DEADLINE_S = 120


def big_history(path: Path, workspace: Path) -> None:
    with path.open("w") as out:
        out.write(json.dumps({"emelex_history": 1, "session": "long-run", "workspace": str(workspace)}) + "\n")
        for i in range(LINES):
            role = "user" if i % 2 == 0 else "assistant"
            out.write(json.dumps({"role": role, "text": f"line {i}: " + "words of a long conversation " * 12}) + "\n")


def test_a_sigkill_during_an_import_leaves_no_half_session(tmp_path: Path, workspace: Path, home: Path) -> None:
    path = tmp_path / "long.jsonl"
    big_history(path, workspace)
    env = {**os.environ, "EMELEX_HOME": str(home), "EMELEX_PLUGINS_AUTOLOAD": "0"}
    MemoryStore.open(Settings(home=home)).close()
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    wal = Path(str(db) + "-wal")
    base = wal.stat().st_size if wal.exists() else 0
    child = subprocess.Popen([EMELEX, "memory", "import", str(path)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while (wal.stat().st_size if wal.exists() else 0) < base + 4 * 1024 * 1024:
            assert child.poll() is None, "the import finished before it could be killed mid-transaction: make it longer"
            assert time.monotonic() < deadline, "the import never started writing"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=DEADLINE_S)
    assert child.returncode == -signal.SIGKILL
    assert table_rows(db) == before  # no Session, no event, no import record, no job
    result = subprocess.run([EMELEX, "memory", "import", "--json", str(path)], env=env, capture_output=True,
                            text=True, timeout=DEADLINE_S)
    assert result.returncode == 0, result.stderr
    (source,) = json.loads(result.stdout)["sources"]
    assert (source["outcome"], source["last_line"], source["events"]) == ("imported", LINES + 1, LINES)
    with MemoryStore.open(Settings(home=home)) as store:
        assert store.get_session(source["session_id"]).last_seq == LINES
