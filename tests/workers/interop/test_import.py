"""`emelex memory import` over fixtures of each format written for these tests in the formats' own shapes (Claude
Code session files, Codex rollout files, OpenAI Agents SDK SQLiteSession databases, the generic JSON Lines): the
Sessions they become (in the workspace they were recorded in, timestamps kept, provenance recorded), re-import as a
no-op, a file growing between imports, damaged lines, a rewritten file, a workspace that no longer exists; and the
imported Sessions found by `memory search` and distilled by `memory work` on the default model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, Settings
from emelex_workers.cli import app

from ...support import table_rows

HISTORIES = Path(__file__).parent / "histories"
runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_PLUGINS_AUTOLOAD", "0")
    return home


def history(tmp_path: Path, name: str, workspace: Path, as_name: str | None = None) -> Path:
    """A copy of fixture `name` whose recorded workspace is `workspace`."""
    text = (HISTORIES / name).read_text().replace("__WORKSPACE__", str(workspace))
    path = tmp_path / (as_name or name)
    path.write_text(text)
    return path


def agents_db(tmp_path: Path) -> Path:
    """An OpenAI Agents SDK SQLiteSession database: its two tables as the SDK creates them, two sessions' items."""
    path = tmp_path / "agents.db"
    conn = apsw.Connection(str(path))
    conn.execute(
        "CREATE TABLE agent_sessions (session_id TEXT PRIMARY KEY, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, "
        "updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP);"
        "CREATE TABLE agent_messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, "
        "message_data TEXT NOT NULL, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, FOREIGN KEY (session_id) "
        "REFERENCES agent_sessions (session_id) ON DELETE CASCADE);"
        "CREATE INDEX idx_agent_messages_session_id ON agent_messages (session_id, id);"
    )
    items = [
        ("support-bot", {"role": "user", "content": "Refunds over 500 euros need a manager's approval."}),
        ("support-bot", {"type": "function_call", "name": "lookup_policy", "arguments": "{\"topic\": \"refunds\"}",
                         "call_id": "fc_1", "id": "fc_1", "status": "completed"}),
        ("support-bot", {"type": "function_call_output", "call_id": "fc_1", "output": "approval above 500 EUR"}),
        ("support-bot", {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": "Yes: above 500 euros a manager approves.",
                                      "annotations": []}]}),
        ("triage", {"role": "user", "content": "Tickets tagged P1 page the on-call engineer."}),
    ]
    for session_id, item in items:
        conn.execute("INSERT OR IGNORE INTO agent_sessions (session_id) VALUES (?)", (session_id,))
        conn.execute("INSERT INTO agent_messages (session_id, message_data, created_at) VALUES (?, ?, ?)",
                     (session_id, json.dumps(item), "2026-11-27 15:04:05"))
    conn.close()
    return path


def imported(*args: str) -> dict:
    result = runner.invoke(app, ["memory", "import", "--json", *args])
    return {"exit": result.exit_code, **json.loads(result.stdout)}


def db(home: Path) -> Path:
    return home / "memory" / "emelex.sqlite3"


def events(session_id: str) -> list[tuple[str, dict]]:
    with MemoryStore.open(Settings()) as store:
        return [(e.kind, e.payload) for e in store.replay(session_id).events]


@pytest.mark.parametrize("name, kinds, first_text", [
    ("claude-code.jsonl", ["user", "assistant", "tool_calls", "tool_result", "assistant"],
     "The billing service must stay on Postgres 15 until the migration window in March."),
    ("codex.jsonl", ["user", "tool_calls", "tool_result", "assistant"],
     "Release builds are signed with the key in ops/release.key; never commit it."),
    ("generic.jsonl", ["user", "tool_calls", "tool_result", "assistant"],
     "Our API rate limit is 120 requests per minute per token."),
])
def test_each_format_becomes_a_session_with_its_provenance(tmp_path, workspace, name, kinds, first_text) -> None:
    path = history(tmp_path, name, workspace)
    out = imported(str(path))
    assert out["exit"] == 0, out
    (source,) = out["sources"]
    assert source["outcome"] == "imported" and source["created"] and source["job_id"]
    shown = events(source["session_id"])
    assert [k for k, _ in shown] == kinds
    assert shown[0][1]["text"] == first_text
    calls = next(p for k, p in shown if k == "tool_calls")["calls"]
    result = next(p for k, p in shown if k == "tool_result")
    assert result["call_id"] == calls[0]["call_id"] and result["tool"] == calls[0]["tool"]
    with MemoryStore.open(Settings()) as store:
        session = store.get_session(source["session_id"])
        (run,) = store.session_imports(source["session_id"])
        first_event = store.replay(source["session_id"]).events[0]
    assert Path(session.workspace.path) == workspace.resolve()
    lines = path.read_text().count("\n")
    assert (run.path, run.first_line, run.last_line) == (str(path), 1, lines)
    assert run.prefix_digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert first_event.created_at < 1_800_000_000 and first_event.created_at > 1_790_000_000  # the source's time
    before = table_rows(db(Path(Settings().home_dir)))
    again = imported(str(path))
    assert again["sources"][0]["outcome"] == "unchanged" and again["exit"] == 0
    assert table_rows(db(Path(Settings().home_dir))) == before


def test_an_agents_sdk_database_becomes_one_session_per_conversation(tmp_path, workspace) -> None:
    path = agents_db(tmp_path)
    refused = imported(str(path))
    assert refused["exit"] == 1 and "--workspace" in refused["sources"][0]["message"]
    out = imported(str(path), "--workspace", str(workspace))
    assert out["exit"] == 0 and [s["outcome"] for s in out["sources"]] == ["imported", "imported"]
    by_title = {}
    with MemoryStore.open(Settings()) as store:
        for s in out["sources"]:
            by_title[store.get_session(s["session_id"]).title] = s["session_id"]
    assert [k for k, _ in events(by_title["support-bot"])] == ["user", "tool_calls", "tool_result", "assistant"]
    conn = apsw.Connection(str(path))
    conn.execute("INSERT INTO agent_messages (session_id, message_data) VALUES ('triage', ?)",
                 (json.dumps({"role": "assistant", "content": [{"type": "output_text", "text": "Paging works."}]}),))
    conn.execute("DELETE FROM agent_messages WHERE id = 4")  # pop_item on support-bot: a rewritten history
    conn.close()
    grown = imported(str(path), "--workspace", str(workspace))
    outcomes = {s["outcome"]: s for s in grown["sources"]}
    assert grown["exit"] == 1 and set(outcomes) == {"imported", "refused"}
    assert "changed in rows an earlier import read" in outcomes["refused"]["message"]
    assert [k for k, _ in events(by_title["triage"])] == ["user", "assistant"]


def test_a_grown_file_imports_only_its_new_lines(tmp_path, workspace) -> None:
    path = history(tmp_path, "claude-code.jsonl", workspace)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:40])  # the fourth line still being written: not read yet
    first = imported(str(path))["sources"][0]
    assert (first["first_line"], first["last_line"], first["events"]) == (1, 3, 3)
    path.write_text("".join(lines))
    second = imported(str(path))["sources"][0]
    assert (second["outcome"], second["session_id"], second["created"]) == ("imported", first["session_id"], False)
    assert (second["first_line"], second["last_line"], second["events"]) == (4, len(lines), 2)
    assert [k for k, _ in events(first["session_id"])] == ["user", "assistant", "tool_calls", "tool_result",
                                                            "assistant"]
    # the result names the tool of a call imported by the first run
    assert events(first["session_id"])[3][1]["tool"] == "Read"
    with MemoryStore.open(Settings()) as store:
        runs = store.session_imports(first["session_id"])
        jobs = store.list_jobs(kind="distill").jobs
    assert [(r.first_line, r.last_line, r.first_seq, r.last_seq) for r in runs] == [(1, 3, 1, 3), (4, 8, 4, 5)]
    assert runs[1].prefix_digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted((j.source["first_seq"], j.source["last_seq"]) for j in jobs) == [(1, 3), (4, 5)]


def test_a_damaged_line_refuses_its_file_by_line_and_writes_nothing(tmp_path, workspace, home) -> None:
    path = history(tmp_path, "codex.jsonl", workspace)
    lines = path.read_text().splitlines(keepends=True)
    lines[6] = lines[6][:50] + "\n"
    path.write_text("".join(lines))
    runner.invoke(app, ["memory", "import", str(history(tmp_path, "generic.jsonl", workspace))])
    before = table_rows(db(home))
    out = imported(str(path))
    assert out["exit"] == 1 and out["sources"][0]["outcome"] == "refused"
    assert f"{path}:7: not JSON" in out["sources"][0]["message"] and "--skip-damaged" in out["sources"][0]["message"]
    assert table_rows(db(home)) == before
    skipped = imported(str(path), "--skip-damaged")["sources"][0]
    assert skipped["outcome"] == "imported" and skipped["skipped"] >= 1
    kinds = [k for k, _ in events(skipped["session_id"])]
    assert kinds == ["user", "tool_result", "assistant"]  # the damaged function_call line is the one left out


def test_a_rewritten_file_is_refused(tmp_path, workspace, home) -> None:
    path = history(tmp_path, "generic.jsonl", workspace)
    imported(str(path))
    path.write_text(path.read_text().replace("120 requests", "999 requests"))
    before = table_rows(db(home))
    out = imported(str(path))
    assert out["exit"] == 1 and "rewritten, not appended to" in out["sources"][0]["message"]
    assert table_rows(db(home)) == before


def test_a_workspace_that_no_longer_exists_is_refused_until_one_is_named(tmp_path, workspace, home) -> None:
    gone = tmp_path / "deleted-project"
    path = history(tmp_path, "claude-code.jsonl", gone)
    MemoryStore.open(Settings()).close()
    before = table_rows(db(home))
    out = imported(str(path))
    assert out["exit"] == 1
    message = out["sources"][0]["message"]
    assert str(gone) in message and "does not exist" in message and "--workspace DIR" in message
    assert table_rows(db(home)) == before
    moved = imported(str(path), "--workspace", str(workspace))
    assert moved["exit"] == 0 and moved["sources"][0]["outcome"] == "imported"


def test_a_folder_imports_every_history_in_it_and_goes_on_past_a_refusal(tmp_path, workspace) -> None:
    folder = tmp_path / "projects" / "-home-me-project"
    folder.mkdir(parents=True)
    history(folder, "claude-code.jsonl", workspace, "5f0e7c1a.jsonl")
    (folder / "broken.jsonl").write_text("{not json\n")
    result = runner.invoke(app, ["memory", "import", str(tmp_path / "projects")])
    assert result.exit_code == 1
    assert "refused    " in result.stdout and "broken.jsonl:1: not JSON" in result.stdout
    assert "imported   " in result.stdout and "-> new Session" in result.stdout


def test_imported_sessions_are_found_by_memory_search(tmp_path, workspace) -> None:
    for name in ("claude-code.jsonl", "codex.jsonl"):
        imported(str(history(tmp_path, name, workspace)))
    found = runner.invoke(app, ["memory", "search", "-w", str(workspace), "Postgres", "release.key"])
    assert found.exit_code == 0
    assert "Postgres 15" in found.stdout.replace("[", "").replace("]", "")
    assert "ops/release.key" in found.stdout.replace("[", "").replace("]", "")


def test_a_run_planned_from_a_stale_record_is_refused(tmp_path, workspace, home) -> None:
    """Two importers of one file: the second commits nothing once the first's run is recorded."""
    from emelex_memory import ImportConflictError, ImportedEvent, ImportSource

    with MemoryStore.open(Settings()) as store:
        source = ImportSource("jsonl", "race", str(tmp_path / "race.jsonl"), 1, 1, 10, "0" * 64)
        event = ImportedEvent("user", {"text": "first"}, 1.0, True)
        store.import_history(workspace, source, [event], planned_from=None)
        before = table_rows(db(home))
        with pytest.raises(ImportConflictError, match="imported by another run meanwhile"):
            store.import_history(workspace, source, [event], planned_from=None)
    assert table_rows(db(home)) == before


def test_sessions_show_names_where_an_imported_session_came_from(tmp_path, workspace) -> None:
    path = history(tmp_path, "codex.jsonl", workspace)
    session_id = imported(str(path))["sources"][0]["session_id"]
    shown = runner.invoke(app, ["memory", "sessions", "show", session_id[:8]])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert shown.exit_code == 0
    assert f"imported:  codex {path} lines 1-10 -> #1-#4 (sha256 {digest[:16]}" in shown.stdout
    data = json.loads(runner.invoke(app, ["memory", "sessions", "show", session_id, "--json"]).stdout)
    assert data["imported_from"][0] | {"imported_at": 0} == {
        "format": "codex", "path": str(path), "first_line": 1, "last_line": 10, "digest": digest, "first_seq": 1,
        "last_seq": 4, "skipped": 5, "cut": 0, "imported_at": 0}


def test_an_import_of_nothing_importable_creates_no_store(tmp_path, home) -> None:
    result = runner.invoke(app, ["memory", "import", str(tmp_path / "missing.jsonl"), str(tmp_path)])
    assert result.exit_code == 1
    assert "is neither a file nor a directory" in result.stdout and "no *.jsonl history files in it" in result.stdout
    assert not home.exists()


SESSION = "5f0e7c1a-3b2d-4e8f-9a61-2c4d8e0f1a2b"


@pytest.mark.parametrize("bookkeeping", [
    [{"type": "last-prompt", "lastPrompt": "go on", "sessionId": SESSION}],
    [{"type": "ai-title", "aiTitle": "Postgres pin", "sessionId": SESSION}],
    [{"type": "a-record-type-not-invented-yet", "sessionId": SESSION}],
    [{"type": "mode", "mode": "default"}, {"type": "hook-telemetry", "n": 1}],  # no session named: the scan goes on
    [{"type": "queue-operation", "operation": "enqueue", "content": f"prompt {i}", "sessionId": SESSION}
     for i in range(40)],  # more than the scan reads: the first names its session
])
def test_a_claude_code_file_led_by_bookkeeping_records_is_told_by_its_shape(tmp_path, workspace, bookkeeping) -> None:
    """Claude Code opens most session files with bookkeeping records of types that come and go (`last-prompt`,
    `mode`, `ai-title`, ...), not with a message: the format is told by the first line that has a reader's shape."""
    path = history(tmp_path, "claude-code.jsonl", workspace)
    path.write_text("".join(json.dumps(r) + "\n" for r in bookkeeping) + path.read_text())
    out = imported(str(path))
    assert out["exit"] == 0, out
    (source,) = out["sources"]
    assert (source["outcome"], source["format"]) == ("imported", "claude-code")
    assert [k for k, _ in events(source["session_id"])] == ["user", "assistant", "tool_calls", "tool_result",
                                                             "assistant"]


def test_a_file_no_line_of_which_has_a_known_shape_is_refused_naming_it(tmp_path, home) -> None:
    path = tmp_path / "telemetry.jsonl"
    path.write_text("".join(json.dumps({"event": "hook", "n": i}) + "\n" for i in range(3)))
    out = imported(str(path))
    assert out["exit"] == 1 and "cannot tell its format" in out["sources"][0]["message"]


def test_an_imported_session_is_titled_as_its_agent_titled_it_else_by_its_first_words(tmp_path, workspace) -> None:
    """Claude Code titles a session with `custom-title` (the user's /rename) and `ai-title` records, newest last;
    a history without a title is titled by what its user said first, not by its file name."""
    path = history(tmp_path, "claude-code.jsonl", workspace)
    titles = [{"type": "ai-title", "aiTitle": "Postgres pin for billing", "sessionId": SESSION},
              {"type": "custom-title", "customTitle": "billing: stay on PG 15", "sessionId": SESSION},
              {"type": "ai-title", "aiTitle": "Billing Postgres version", "sessionId": SESSION}]
    path.write_text(path.read_text() + "".join(json.dumps(r) + "\n" for r in titles))
    codex = history(tmp_path, "codex.jsonl", workspace)
    out = imported(str(path), str(codex))
    assert out["exit"] == 0, out
    with MemoryStore.open(Settings()) as store:
        got = [store.get_session(s["session_id"]).title for s in out["sources"]]
    assert got == ["billing: stay on PG 15",
                   "Release builds are signed with the key in ops/release.key; never commit it."]


def test_a_folder_walk_passes_over_files_that_are_no_history_and_says_so(tmp_path, workspace) -> None:
    """Other tools keep JSON Lines files of their own beside the histories (hook logs under ~/.claude/projects): a
    folder's import names each one it passes over and does not fail for them; named alone, such a file is refused."""
    folder = tmp_path / "projects" / "-home-me-project"
    folder.mkdir(parents=True)
    history(folder, "claude-code.jsonl", workspace, "5f0e7c1a.jsonl")
    log = folder / "hook-log.jsonl"
    log.write_text(json.dumps({"event": "skill-injection", "hookEvent": "UserPromptSubmit"}) + "\n")
    result = runner.invoke(app, ["memory", "import", str(tmp_path / "projects")])
    assert result.exit_code == 0, result.stdout
    assert f"skipped    {log}: no line of it has the shape of a history" in result.stdout
    assert "imported   " in result.stdout
    alone = imported(str(log))
    assert alone["exit"] == 1 and alone["sources"][0]["outcome"] == "refused"


def test_what_import_prints_names_each_file_once_and_counts_in_words(tmp_path, workspace) -> None:
    path = history(tmp_path, "generic.jsonl", workspace)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))
    runner.invoke(app, ["memory", "import", str(path)])
    path.write_text("".join(lines))
    grown = runner.invoke(app, ["memory", "import", str(path)])
    assert grown.exit_code == 0
    assert f"imported   {path} -> Session " in grown.stdout and ": line 5, 1 event, distillation queued" in grown.stdout
    db_path = agents_db(tmp_path)
    refused = runner.invoke(app, ["memory", "import", str(db_path)])
    assert f"refused    {db_path} (Session 'support-bot') does not say" in refused.stdout
    assert refused.stdout.count(str(db_path)) == 2  # one line for each of its two Sessions


def test_a_workspace_named_with_the_option_that_does_not_exist_is_said_to_be_the_option(tmp_path, home) -> None:
    missing = tmp_path / "no-such-dir"
    out = imported(str(agents_db(tmp_path)), "--workspace", str(missing))
    assert out["exit"] == 1
    message = out["sources"][0]["message"]
    assert f"--workspace {missing} does not exist" in message and "recorded in" not in message


def test_resuming_an_imported_session_says_why_it_cannot_before_any_model_is_needed(tmp_path, workspace,
                                                                                   home) -> None:
    """An imported Session has no execution snapshot, so `emelex chat` cannot resume it: on a Home without a model,
    the user is told that, and where it came from, not first asked to install a model."""
    path = history(tmp_path, "generic.jsonl", workspace)
    session_id = imported(str(path))["sources"][0]["session_id"]
    before = table_rows(db(home))
    out = runner.invoke(app, ["chat", "--resume", session_id[:8], "--workspace", str(workspace)])
    assert out.exit_code == 1
    (line,) = out.output.splitlines()
    assert "no execution snapshot" in line and f"imported from {path}" in line and "model" not in line
    assert "emelex memory sessions show" in line and "a new chat here recalls" in line
    assert table_rows(db(home)) == before


def test_a_format_named_wrongly_is_refused_not_reported_as_an_empty_history(tmp_path, workspace, home) -> None:
    path = history(tmp_path, "generic.jsonl", workspace)
    out = imported(str(path), "--format", "codex")
    assert out["exit"] == 1 and out["sources"][0]["outcome"] == "refused"
    assert "no line of it is a codex history line" in out["sources"][0]["message"]


def test_lines_without_a_time_take_the_first_time_the_file_gives_else_its_modification_time(tmp_path,
                                                                                           workspace) -> None:
    """No imported event is dated 1970: undated lines before the first dated one take its time, and a history
    with no time at all is dated by the file's modification time (when its last line was written)."""
    header = {"emelex_history": 1, "workspace": str(workspace)}
    undated = [{"role": "user", "text": "The staging database is db-staging-2."},
               {"role": "assistant", "text": "Noted: db-staging-2."}]
    later = {"role": "user", "text": "It moves to db-staging-3 in January.", "at": "2026-11-28T12:00:00Z"}
    partly = tmp_path / "partly.jsonl"
    partly.write_text("".join(json.dumps(o) + "\n" for o in [{**header, "session": "a"}, *undated, later]))
    never = tmp_path / "never.jsonl"
    never.write_text("".join(json.dumps(o) + "\n" for o in [{**header, "session": "b"}, *undated]))
    written = 1_790_000_000
    import os
    os.utime(never, (written, written))
    stamps = {}
    for path in (partly, never):
        out = imported(str(path))
        assert out["exit"] == 0, out
        sid = out["sources"][0]["session_id"]
        with MemoryStore.open(Settings()) as store:
            stamps[path.name] = ([e.created_at for e in store.replay(sid).events], store.get_session(sid).created_at)
    first_dated = 1_795_867_200  # 2026-11-28T12:00:00Z
    assert stamps["partly.jsonl"] == ([first_dated] * 3, first_dated)
    assert stamps["never.jsonl"] == ([written] * 2, written)
