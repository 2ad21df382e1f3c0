"""`diagnose`: a health report of Emelex Home and its database that never raises and changes nothing.

It checks the files first, then opens the database as it is (`opening.open_as_is`): no lock sidecar or
store marker is recreated, no folder created, no migration run, so every check reports what it found.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import apsw

from ..assets.refs import asset_dir_for
from ..assets.service import AssetStore
from ..core.connection import DBCONFIG, PRAGMAS, read_dbconfig, read_pragmas
from ..core.database import Database
from ..errors import EmelexError, InvalidInputError, NoStoreError
from ..core.private_files import absolute, check_home, check_no_symlinks, check_private_dir, check_private_file, describe_mode
from ..core.migrations import APPLICATION_ID, MIGRATIONS
from ..core.opening import STORE_MARKER, check_missing_database, locate_database, open_as_is, sidecar_path
from ..search.vectors import text_digest
from ..sessions.holders import live_lease
from ..core.settings import Settings

DOCTOR_ASSET_ENTRIES = 1000  # asset entries one doctor run re-hashes at most
DOCTOR_ASSET_BYTES = 256 * 1024 * 1024  # and the bytes it hashes at most (at least one file is checked)
_LISTED_PROBLEMS = 5


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, whether it is healthy, and the finding in words."""

    name: str
    ok: bool
    detail: str


@dataclass
class DoctorReport:
    """Every check plus the facts gathered; `healthy` is True when every check passed. `no_store` is True when
    there is no store to check yet (the one "open" check says so, and nothing else was checked)."""

    checks: list[Check] = field(default_factory=list)
    facts: dict[str, object] = field(default_factory=dict)
    no_store: bool = False

    @property
    def healthy(self) -> bool:
        """True when nothing is wrong."""
        return all(c.ok for c in self.checks)

    def add(self, name: str, ok: bool, detail: str) -> None:
        """Record one check."""
        self.checks.append(Check(name, ok, detail))


def _mode(path: Path) -> str:
    try:
        return describe_mode(os.lstat(path))
    except FileNotFoundError:
        return "missing"


_PROBLEMS = (EmelexError, apsw.Error, OSError)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, apsw.Error):
        return f"SQLite reports: {exc}; restore the database from a backup if it is damaged"
    if isinstance(exc, OSError) and not isinstance(exc, EmelexError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
    return str(exc)


_RECREATED = "; the next command that opens the store (e.g. `emelex memory sessions list`) recreates it"


def _check_path(
    report: DoctorReport, name: str, path: Path, directory: bool, *, required: bool = True, missing: str = "",
    said: str = "", home: bool = False,
) -> None:
    """One file check; `missing` ends the finding of a missing required path, and a finding equal to `said` (what
    the failed open already reported) is not repeated."""
    try:
        if home:
            check_home(path)  # a symlinked Home: the one remedy is to name the real directory
        if not os.path.lexists(path):
            if required:
                report.add(name, False, f"{path} is missing{missing}")
            return
        if directory:
            check_private_dir(path)
        else:
            check_private_file(path, what=name)
        report.add(name, True, f"{path} (mode {_mode(path)})")
    except _PROBLEMS as exc:
        if _describe(exc) != said:
            report.add(name, False, _describe(exc))


def _check_files(report: DoctorReport, settings: Settings, db: Path, standard: bool, said: str = "") -> None:
    if standard:
        _check_path(report, "home directory", settings.home_dir, True, said=said, home=True)
        _check_path(report, "store marker", settings.home_dir / STORE_MARKER, False, missing=_RECREATED, said=said)
    _check_path(report, "database directory", db.parent, True, said=said)
    _check_path(report, "database file", db, False, said=said)
    _check_path(report, "lock sidecar", sidecar_path(db), False, missing=_RECREATED, said=said)
    for suffix in ("-wal", "-shm"):
        _check_path(report, f"database {suffix[1:]} file", Path(f"{db}{suffix}"), False, required=False, said=said)
    _check_path(report, "asset directory", asset_dir_for(db), True, required=False, said=said)


def _locate(settings: Settings, db: Path, standard: bool) -> None:
    """What `MemoryStore.open(create=False)` (or `open_path`) checks before it opens, creating nothing."""
    evidence = (asset_dir_for(db),)
    if not standard:
        check_no_symlinks(db, what="database", fix="open {real} instead")
        locate_database(db, evidence=evidence)
        return
    home, marker = settings.home_dir, settings.home_dir / STORE_MARKER
    check_home(home)
    if os.path.lexists(home):
        check_private_dir(home)
    if not os.path.lexists(settings.memory_dir):
        check_missing_database(db, create=False, where=home, marker=marker, evidence=evidence)
    locate_database(db, marker=marker, evidence=evidence, where=home)


def _check_pragmas(report: DoctorReport, db: Database) -> None:
    with db.read() as conn:
        live = read_pragmas(conn)
        config = read_dbconfig(conn)
    report.facts["pragmas"] = live
    wrong = [f"{n}={live[n]!r} (want {want!r})" for n, _, want in PRAGMAS if live[n] != want]
    report.add("pragmas", not wrong, "; ".join(wrong) or ", ".join(f"{k}={v}" for k, v in live.items()))
    report.facts["connection_settings"] = config
    wrong = [f"{n}={config[n]} (want {want})" for n, _, want in DBCONFIG if config[n] != want]
    report.add("connection settings", not wrong, "; ".join(wrong) or ", ".join(f"{k}={v}" for k, v in config.items()))


def _check_schema(report: DoctorReport, db: Database) -> bool:
    """Report the schema version; True when it is the current one (the checks that read tables rely on it)."""
    with db.read() as conn:
        version = conn.execute("PRAGMA user_version").fetchall()[0][0]
        app_id = conn.execute("PRAGMA application_id").fetchall()[0][0]
    report.facts["schema_version"] = version
    current = version == len(MIGRATIONS) and app_id == APPLICATION_ID
    detail = f"version {version} of {len(MIGRATIONS)}, application_id {app_id:#x}"
    if version == 0:
        detail += ": the database is empty (no schema); restore it from a backup"
    elif version < len(MIGRATIONS):
        detail += (
            ": an older schema; run any other `emelex memory` command (opening the store migrates it), then doctor "
            "again (doctor itself changes nothing); the checks that read tables wait for that"
        )
    report.add("schema", current, detail)
    return current


def _check_integrity(report: DoctorReport, db: Database) -> None:
    with db.read() as conn:
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check(20)")]
    ok = problems == ["ok"]
    report.add("integrity", ok, "ok" if ok else "; ".join(problems) + "; restore the database from a backup")


# Events whose seq is not their rank in the Session or whose byte_end is not the running total of sizes.
_BROKEN_TRANSCRIPT = (
    "SELECT s.uuid, e.seq FROM (SELECT session_id, seq, byte_end, row_number() OVER w AS n, sum(size) OVER w AS total "
    "FROM events WINDOW w AS (PARTITION BY session_id ORDER BY seq)) e JOIN sessions s ON s.id = e.session_id "
    "WHERE e.seq != e.n OR e.byte_end != e.total LIMIT 5"
)


def _check_transcripts(report: DoctorReport, db: Database) -> None:
    """Every Session's seqs run 1, 2, 3, ... and each event's byte_end is the running total its head relies on."""
    with db.read() as conn:
        broken = conn.execute(_BROKEN_TRANSCRIPT).fetchall()
    detail = "; ".join(f"Session {sid} at seq {seq}" for sid, seq in broken)
    report.add(
        "transcripts",
        not broken,
        "seqs are consecutive and byte totals add up" if not broken else
        f"{detail}: a gap in the seqs or a byte_end that is not the running total; restore the database from a backup",
    )


# The events, and how many have a stored payload that is not JSON: one read of the table.
_COUNT_PAYLOADS = "SELECT count(*), total(NOT json_valid(payload)) FROM events"
# Events whose stored payload is not JSON: append_turn stores only canonical JSON, so each was altered behind our back.
_BAD_PAYLOADS = (
    "SELECT s.uuid, e.seq FROM events e JOIN sessions s ON s.id = e.session_id WHERE NOT json_valid(e.payload) "
    "ORDER BY e.session_id, e.seq LIMIT 5"
)


def _check_payloads(report: DoctorReport, db: Database) -> None:
    """Every event payload is valid JSON (a full scan, as the integrity check is; the first 5 offenders named).

    The same scan counts the events: the exact `events` fact, at no read of its own.
    """
    with db.read() as conn:
        events, invalid = conn.execute(_COUNT_PAYLOADS).fetchone()
        bad = conn.execute(_BAD_PAYLOADS).fetchall() if invalid else []
    report.facts["events"] = events
    detail = "; ".join(f"Session {sid} at seq {seq}" for sid, seq in bad)
    report.add(
        "payloads",
        not bad,
        "every event payload is valid JSON" if not bad else
        f"{detail}: a stored payload is not valid JSON; restore the database from a backup",
    )


# The search index against what it indexes (schema step m014): rows the store holds that the index lacks or holds
# otherwise, then the counts (equal counts with nothing missing: no row indexed that the store no longer holds).
_SEARCH_INDEXES = (
    ("transcript", "SELECT count(*) FROM event_search_source s WHERE s.body <> '' AND NOT EXISTS (SELECT 1 FROM "
     "event_search f WHERE f.rowid = s.id AND f.ws = s.ws AND f.body = s.body)",
     "SELECT (SELECT count(*) FROM event_search_source WHERE body <> ''), (SELECT count(*) FROM event_search)"),
    ("Knowledge", "SELECT count(*) FROM knowledge_search_source s WHERE NOT EXISTS (SELECT 1 FROM knowledge_search f "
     "WHERE f.rowid = s.id AND f.ws = s.ws AND f.key = s.key AND f.content = s.content)",
     "SELECT (SELECT count(*) FROM knowledge_search_source), (SELECT count(*) FROM knowledge_search)"),
    ("Session title and date", "SELECT count(*) FROM session_search_source s WHERE NOT EXISTS (SELECT 1 FROM "
     "session_search f WHERE f.rowid = s.id AND f.ws = s.ws AND f.head = s.head)",
     "SELECT (SELECT count(*) FROM session_search_source), (SELECT count(*) FROM session_search)"),
)
# Each stored vector with the text its row holds now (NULL: the row is gone) and the row's workspace token.
_VECTOR_ROWS = (
    "SELECT v.model, v.item, v.item_id, v.workspace_id, v.digest, CASE v.item "
    "WHEN 'event' THEN (SELECT body FROM event_search WHERE rowid = v.item_id) "
    "ELSE (SELECT key || ' ' || content FROM knowledge_search WHERE rowid = v.item_id) END, CASE v.item "
    "WHEN 'event' THEN (SELECT ws FROM event_search WHERE rowid = v.item_id) "
    "ELSE (SELECT ws FROM knowledge_search WHERE rowid = v.item_id) END "
    "FROM search_vectors v WHERE (v.model, v.item, v.item_id) > (?, ?, ?) ORDER BY v.model, v.item, v.item_id LIMIT ?"
)
_VECTOR_PAGE = 1000


def _check_search_index(report: DoctorReport, db: Database) -> None:
    """The search index holds exactly the live Knowledge and transcript text the store holds (a full read)."""
    problems = []
    with db.read() as conn:
        for what, missing_sql, counts_sql in _SEARCH_INDEXES:
            missing = conn.execute(missing_sql).fetchone()[0]
            held, indexed = conn.execute(counts_sql).fetchone()
            if missing or held != indexed:
                problems.append(f"the {what} index lacks or differs in {missing} of {held} rows and holds "
                                f"{indexed - held + missing} it should not")
    report.add(
        "search index",
        not problems,
        "the search index agrees with the store" if not problems else
        "; ".join(problems) + "; restore the database from a backup",
    )


def _check_search_vectors(report: DoctorReport, db: Database) -> None:
    """Every stored vector embeds exactly what its row holds now, in its workspace (a full read, in pages)."""
    checked = stale = 0
    after = ("", "", 0)
    with db.read() as conn:
        while True:
            rows = conn.execute(_VECTOR_ROWS, (*after, _VECTOR_PAGE)).fetchall()
            for _, _, _, workspace_id, digest, text, ws in rows:
                checked += 1
                if text is None or ws != f"w{workspace_id}" or text_digest(text) != digest:
                    stale += 1
            if len(rows) < _VECTOR_PAGE:
                break
            after = rows[-1][:3]
    report.add("search vectors", not stale,
               f"{checked} vectors, each of its row's current text" if not stale else
               f"{stale} of {checked} vectors do not embed their row's current text; restore the database from a backup")


def _check_assets(report: DoctorReport, db: Database, max_entries: int, max_bytes: int) -> None:
    """Re-hash catalogued asset files in catalog order, at most `max_entries` entries and about `max_bytes` bytes
    (one file more at most), with `verify_assets`; never creates the asset folder."""
    total = AssetStore(db).asset_totals().entries
    checked = hashed = 0
    problems = []
    cursor = None
    while checked < max_entries and hashed < max_bytes:
        limit = min(max_entries - checked, db.settings.max_page_items)
        page = AssetStore(db).verify_assets(cursor=cursor, limit=limit, max_hash_bytes=max_bytes - hashed)
        checked, hashed, cursor = checked + page.checked, hashed + page.hashed_bytes, page.next_cursor
        problems += page.problems
        if cursor is None:
            break
    counted = f"checked {checked} of {total} asset entries ({hashed} bytes hashed)"
    if problems:
        listed = "; ".join(f"{p.digest} ({', '.join(p.media_kinds)}): {p.detail}" for p in problems[:_LISTED_PROBLEMS])
        more = f"; and {len(problems) - _LISTED_PROBLEMS} more" if len(problems) > _LISTED_PROBLEMS else ""
        report.add("assets", False, f"{counted}, {len(problems)} damaged: {listed}{more}")
        return
    rest = "" if cursor is None else "; run `emelex memory assets verify` to check them all"
    report.add("assets", True, f"{counted}, all intact{rest}")


def _count_contents(report: DoctorReport, db: Database) -> None:
    """Exact counts of Sessions, live leases, Summaries and assets (one row read per Session, Summary or asset
    entry, each far fewer than events); the event count comes from `_check_payloads`' scan."""
    with db.read() as conn:
        sessions = conn.execute("SELECT count(*) FROM sessions").fetchone()[0]
        live_leases = conn.execute(
            f"SELECT count(*) FROM session_leases WHERE {live_lease()}", (db.clock(),)
        ).fetchone()[0]
        summaries, reverted = conn.execute(
            "SELECT count(*), count(reverted_at) FROM summaries"  # reverted ones stay stored; replay skips them
        ).fetchone()
    assets = AssetStore(db).asset_totals()
    report.facts.update(
        sessions=sessions, live_leases=live_leases, summaries=summaries, reverted_summaries=reverted,
        assets=assets.files, asset_entries=assets.entries, asset_bytes=assets.bytes,
    )


def diagnose(
    settings: Settings | None = None,
    *,
    database: Path | None = None,
    max_asset_entries: int = DOCTOR_ASSET_ENTRIES,
    max_asset_bytes: int = DOCTOR_ASSET_BYTES,
) -> DoctorReport:
    """Check Home, file modes, pragmas, connection settings, schema version, integrity, transcripts, event
    payloads, the search index, asset files and contents of the standard (or given) database.

    Asset files are re-hashed in catalog order, at most `max_asset_entries`
    catalog entries and about `max_asset_bytes` bytes (at least one file);
    the "assets" check says how many entries it checked of how many.
    Raises `InvalidInputError` when either bound is below 1.

    Changes nothing: the files are checked first, then the database is
    opened as it is (`opening.open_as_is`: no lock sidecar or marker is
    recreated, no folder created, no migration run; an older schema is
    reported, and the checks that read tables are left out until it is
    migrated; only a hot rollback journal of an interrupted write is
    rolled back, as SQLite's next writer would). A Home (or path) without
    a store is one failed "open" check and `no_store`; a deleted database
    is reported, not recreated. Never
    raises for the problems it finds (unsafe files, a damaged or foreign
    database, ...): each becomes a failed check, and the file checks run
    even when the database cannot be opened (a finding the failed open
    already reported is not repeated).
    """
    for name, bound in (("max_asset_entries", max_asset_entries), ("max_asset_bytes", max_asset_bytes)):
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise InvalidInputError(f"{name} must be a positive integer, got {bound!r}")
    settings = settings or Settings()
    report = DoctorReport()
    standard = database is None
    try:
        db = settings.database_path if standard else absolute(database, what="database")
    except _PROBLEMS as exc:
        report.add("open", False, _describe(exc))
        return report
    report.facts["home"] = str(settings.home_dir)
    report.facts["database"] = str(db)
    try:
        _locate(settings, db, standard)
    except NoStoreError as exc:
        report.no_store = True
        report.add("open", False, str(exc))
        return report
    except _PROBLEMS as exc:
        report.add("open", False, _describe(exc))
        _check_files(report, settings, db, standard, said=_describe(exc))
        return report
    _check_files(report, settings, db, standard)
    try:
        conn, _ = open_as_is(db, busy_timeout_ms=settings.busy_timeout_ms)
        database = Database.wrap(conn, db, settings, time.time)
    except _PROBLEMS as exc:
        report.add("open", False, _describe(exc))
        return report
    try:
        report.add("open", True, f"opened {db} as it is")
        _run(report, "pragmas", lambda: _check_pragmas(report, database))
        if not _run(report, "schema", lambda: _check_schema(report, database)):
            return report
        for name, check in (
            ("integrity", _check_integrity),
            ("transcripts", _check_transcripts),
            ("payloads", _check_payloads),
            ("search index", _check_search_index),
            ("search vectors", _check_search_vectors),
            ("assets", lambda r, s: _check_assets(r, s, max_asset_entries, max_asset_bytes)),
            ("contents", _count_contents),
        ):
            _run(report, name, lambda: check(report, database))
    finally:
        database.close()
    return report


def _run(report: DoctorReport, name: str, check) -> object:
    """Run one check; a problem it raises becomes its failed line (and the result None)."""
    try:
        return check()
    except _PROBLEMS as exc:
        report.add(name, False, _describe(exc))
        return None
