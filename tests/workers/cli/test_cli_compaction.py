"""The way back through the CLI: `sessions show` prints a Summary's text and range, `--raw` every stored event with
the Summary covering it, and `emelex memory compaction revert|redo` undo and redo a compaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, compaction_handler, run_one_job
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ...support import table_rows
from ...compaction.test_compaction import WINDOW, add_turns, summarize, tokens

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def compacted(workspace: Path, times: int = 1) -> tuple[str, list[dict]]:
    """A Session of 10 turns compacted once (Summary #21 covering #1-#12), or twice (six more turns, Summary #34
    covering #13-#25 and #21)."""
    results = []
    with MemoryStore.open(WorkerSettings()) as store:
        session = store.create_session(workspace, title="way back")
        add_turns(store, session.id, workspace, 10)
        for n in range(times):
            if n:
                add_turns(store, session.id, workspace, 6, label="later")
            store.queue_compaction(session.id, context_window=WINDOW, count_tokens=tokens)
            outcome = run_one_job(store, compaction_handler(summarize, model_ref="m@sha256:" + "a" * 64))
            results.append(outcome.job.result | {"job": outcome.job.id})
    return session.id, results


def memory(*args: str):
    return runner.invoke(app, ["memory", *args])


def test_show_prints_a_summarys_text_and_the_range_it_replaces_with_provenance_on_its_own_line(workspace):
    sid, [done] = compacted(workspace)
    shown = memory("sessions", "show", sid)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  #21 "))
    assert lines[at].split()[3:] == ["Summary", "of", "#1-#12"]  # the label once, not "summary Summary of"
    assert lines[at + 1].strip() == "summary of " + ",".join(str(i) for i in range(1, 13))  # the whole text
    assert lines[at + 2].strip() == f"provenance: job {done['job']}, model m@sha256:{'a' * 64}, 12 source events"
    assert '"provenance"' not in shown.output


def test_show_raw_prints_every_event_with_the_summary_covering_it(workspace: Path) -> None:
    sid, _ = compacted(workspace, times=2)
    shown = memory("sessions", "show", sid, "--raw", "--limit", "100")
    assert shown.exit_code == 0, shown.output
    rows = {line.split()[0]: line for line in shown.output.splitlines() if line.startswith("  #")}
    assert list(rows) == [f"#{i}" for i in range(1, 35)]
    assert rows["#3"].endswith("[replaced by Summary #21]") and rows["#13"].endswith("[replaced by Summary #34]")
    assert not rows["#26"].endswith("]")
    assert rows["#21"].endswith("turn 11   Summary of #1-#12 (compacted again by #34)")
    assert rows["#34"].endswith("turn 18   Summary of #21 and #13-#25 (in effect)")
    assert all(rows[s].lower().count("summary") == 1 for s in ("#21", "#34"))  # one "Summary" label a line
    data = json.loads(memory("sessions", "show", sid, "--raw", "--limit", "100", "--json").output)
    by_seq = {e["seq"]: e for e in data["events"]}
    assert by_seq[3]["covered_by"] == 21 and by_seq[26]["covered_by"] is None
    assert by_seq[34]["summary"]["state"] == "in effect" and by_seq[34]["summary"]["base_seq"] == 21
    paged = json.loads(memory("sessions", "show", sid, "--raw", "--limit", "10", "--json").output)
    assert [e["seq"] for e in paged["events"]] == list(range(1, 11)) and paged["next_cursor"] == 10


def test_revert_and_redo_through_the_cli(workspace: Path) -> None:
    sid, _ = compacted(workspace, times=2)
    reverted = memory("compaction", "revert", sid)
    assert reverted.exit_code == 0, reverted.output
    assert reverted.output.startswith(f"reverted Summary #34 of Session {sid}; replay now starts from Summary #21")
    assert f"`emelex memory compaction redo {sid}` brings it back" in reverted.output
    raw = memory("sessions", "show", sid, "--raw", "--limit", "100").output
    assert "Summary of #21 and #13-#25 (reverted " in raw
    doctor = json.loads(memory("doctor", "--json").output)  # a reverted Summary is a healthy state
    assert doctor["healthy"] and (doctor["facts"]["summaries"], doctor["facts"]["reverted_summaries"]) == (2, 1)
    data = json.loads(memory("compaction", "revert", sid, "--json").output)
    assert data["summary_seq"] == 21 and data["view_summary_seq"] is None and data["cancelled_jobs"] == []
    assert "replay now starts from Summary #21" in memory("compaction", "redo", sid, "--summary", "21").output
    redone = memory("compaction", "redo", sid)
    assert redone.exit_code == 0 and redone.output.startswith(f"restored Summary #34 of Session {sid}")
    assert "  #34 " in memory("sessions", "show", sid).output


def test_cli_refusals_are_one_line_and_change_nothing(workspace: Path, home: Path) -> None:
    sid, _ = compacted(workspace, times=2)
    db = home / "memory" / "emelex.sqlite3"
    before = table_rows(db)
    for args, message in [
        (["revert", sid, "--summary", "21"], "error: Summary 21 of Session"),
        (["revert", sid, "--summary", "3"], f"error: seq 3 of Session {sid} is not a Summary"),
        (["redo", sid], "error: Session"),
        (["revert", "no-such-session"], "error: no Session 'no-such-session'"),
    ]:
        result = memory("compaction", *args)
        assert result.exit_code == 1 and result.output.startswith(message), result.output
        assert result.output.count("\n") == 1
    with MemoryStore.open(WorkerSettings()) as store:
        lease = store.acquire_lease(sid, workspace)
        busy = memory("compaction", "revert", sid)
        assert busy.exit_code == 1 and "is leased by" in busy.output
        lease.release()
    assert table_rows(db)["summaries"] == before["summaries"]
    helped = memory("compaction", "--help").output
    assert "revert" in helped and "redo" in helped


LEASER = """
import sys, time
from pathlib import Path
from emelex_memory import MemoryStore, Settings
store = MemoryStore.open(Settings())
lease = store.acquire_lease(sys.argv[1], Path(sys.argv[2]))
print(lease.expires_at, flush=True)
time.sleep(120)
"""


def test_revert_blocked_by_a_dead_holders_lease_says_it_is_dead_and_when_it_frees(workspace: Path, home: Path):
    import os
    import signal
    import subprocess
    import sys

    sid, _ = compacted(workspace)
    proc = subprocess.Popen([sys.executable, "-c", LEASER, sid, str(workspace)], stdout=subprocess.PIPE, text=True,
                            env=os.environ)
    proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)  # the holder dies with its Session lease live
    proc.wait(timeout=60)
    proc.stdout.close()
    before = table_rows(home / "memory" / "emelex.sqlite3")
    busy = memory("compaction", "revert", sid)
    assert busy.exit_code == 1 and busy.output.count("\n") == 1, busy.output
    assert f"is leased by {proc.pid}@" in busy.output
    assert "but that process is gone (no such pid on this host)" in busy.output
    assert "its lease frees at " in busy.output and "run this command again then, nothing was reverted" in busy.output
    assert table_rows(home / "memory" / "emelex.sqlite3") == before
