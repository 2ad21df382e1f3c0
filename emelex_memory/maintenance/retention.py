"""`MemoryStore.maintain`: bounded housekeeping of leases, retention, versions, assets and the database file.

One run, each step capped at `maintain_batch` changes (run again while the
report says `more`), in this order and under these names:

1. `leases`: stale Session leases ('active' past their expiry) become 'failed' ("expired");
2. `jobs`: expired worker claims are rescued through the queue (each a counted failure);
3. `sessions`: Sessions idle longer than `session_retention_days` are deleted
   like `delete_session` (never one with a live lease, a live worker claim
   or an open agent journal),
   and then the files of the assets only they referenced;
4. `knowledge_tombstones`: unpinned Knowledge unchanged for `knowledge_retention_days` is tombstoned;
5. `knowledge_purge`: tombstoned entries older than `knowledge_grace_days` are deleted;
6. `versions`: versions beyond the newest `knowledge_keep_versions` of an
   unpinned entry, superseded more than `knowledge_grace_days` ago, are pruned;
7. `model_states`: saved model states beyond `model_states_keep`, or beyond
   `model_states_max_bytes` counted from the newest, are deleted, never one of a
   Session with a live lease (see `model_states.py`); their assets are then
   unreferenced;
8. `assets`: unreferenced assets are collected (the asset grace period applies); the
   scans of the asset folder for crash orphans and abandoned temporary files,
   whose cost grows with the number of files, start a new pass at most once per
   `assets/collection.py: FOLDER_SCAN_INTERVAL_S` (an hour, the grace period orphans wait
   anyway) and continue run by run until the pass completes;
9. `database`: `PRAGMA optimize`, optional `VACUUM`, then `wal_checkpoint(TRUNCATE)`.

Each step commits on its own: steps 1 and 3-7 in one transaction each, step 2
in one per rescue batch, step 8 as `collect_assets` does (the catalog deletion
first, the files after it). A step that fails leaves the steps before it
committed and itself either not done or done up to its last commit; every step
is safe to run again, so running `maintain` again finishes the work. The
failure raises `MaintenanceError`, whose `report` lists `steps_completed` and
their counts.

Pinned Knowledge is never tombstoned, pruned or deleted; a live lease is
never touched; Knowledge is only deleted after passing through a tombstone
and the grace period. `dry_run` runs steps 1-8 inside one transaction that is
rolled back (so the row counts are exact and nothing changes) and skips step 8
and every file removal: it does not predict asset files removed or bytes freed
(reported as None).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import apsw

from ..assets.collection import folder_scan_due, schedule_folder_scan
from ..assets.service import AssetStore, remove_asset_files
from ..core.database import Database
from ..errors import EmelexError, MaintenanceError, StoreClosedError
from ..knowledge.versions import tombstone_version
from ..queue.service import RESCUE_BATCH, JobQueue
from ..sessions.holders import live_lease, open_journal
from .deletion import delete_session_in
from .model_states import collect_model_states

DAY_S = 86_400.0
STEPS = ("leases", "jobs", "sessions", "knowledge_tombstones", "knowledge_purge", "versions", "model_states", "assets",
         "database")


@dataclass
class MaintenanceReport:
    """What one `maintain` run did (or, with `dry_run`, would do). `more` means a cap was reached: run again.

    `steps_completed` names the steps (see `STEPS`) that ran to the end, in
    order; a dry run lists the ones it ran and rolled back. A dry run removes
    no files and does not predict file removal: its `asset_files_removed` and
    `asset_bytes_freed` are None.
    """

    dry_run: bool
    leases_failed: int = 0
    jobs_rescued: int = 0
    sessions_deleted: int = 0
    knowledge_tombstoned: int = 0
    knowledge_purged: int = 0
    versions_pruned: int = 0
    model_states_removed: int = 0
    asset_entries_removed: int = 0
    asset_files_removed: int | None = 0
    asset_bytes_freed: int | None = 0
    optimized: bool = False
    wal_truncated: bool = False
    vacuumed: bool = False
    more: bool = False
    steps_completed: list[str] = field(default_factory=list)


class _DryRun(Exception):
    """Raised at the end of a dry run to roll its transaction back."""


class Maintenance:
    """Bounded housekeeping (`MemoryStore.maintain`)."""

    def __init__(self, db: Database, assets: AssetStore, jobs: JobQueue) -> None:
        """Maintain `db`, collecting through `assets` and rescuing claims through `jobs`."""
        self._db = db
        self._assets = assets
        self._jobs = jobs

    def maintain(self, *, vacuum: bool = False, dry_run: bool = False) -> MaintenanceReport:
        """Run bounded maintenance (see the module docstring) and return a report of what was done.

        Each step commits on its own and is safe to re-run. When one fails
        (an I/O error, say), raises `MaintenanceError` naming it; its `report`
        holds the steps completed before it and the counts so far. With
        `dry_run=True` nothing changes: the row changes are made in a
        transaction that is rolled back, and the file-level steps (asset file
        removal, optimize, VACUUM, WAL truncation) are skipped; the file counts
        are then None (not predicted). `vacuum=True` additionally rewrites the
        database file, dropping free pages.
        """
        report = MaintenanceReport(dry_run=dry_run)
        now = self._db.clock()
        steps: list[tuple[str, Callable[[], None]]] = [
            ("leases", lambda: self._fail_stale_leases(report, now)),
            ("jobs", lambda: self._rescue_claims(report)),
            ("sessions", lambda: self._retain_sessions(report, now, remove_files=not dry_run)),
            ("knowledge_tombstones", lambda: self._tombstone_stale(report, now)),
            ("knowledge_purge", lambda: self._purge_tombstones(report, now)),
            ("versions", lambda: self._prune_versions(report, now)),
            ("model_states", lambda: self._bound_model_states(report, now)),
            ("assets", lambda: self._collect_unreferenced(report, now)),
        ]
        if not dry_run:
            self._run_steps(report, [*steps, ("database", lambda: self._maintain_file(report, vacuum))])
            return report
        try:
            with self._db.write():
                self._run_steps(report, steps)
                raise _DryRun
        except _DryRun:
            pass
        report.asset_files_removed = report.asset_bytes_freed = None  # files are not touched, nor predicted
        return report

    @staticmethod
    def _run_steps(report: MaintenanceReport, steps: list[tuple[str, Callable[[], None]]]) -> None:
        """Run the steps in order, recording each completed one; raise `MaintenanceError` naming the one that fails."""
        for name, step in steps:
            try:
                step()
            except StoreClosedError:
                raise  # no step failed: the store was closed
            except (apsw.Error, OSError, EmelexError) as exc:
                done = ", ".join(report.steps_completed) or "none"
                outcome = "nothing was changed (dry run)" if report.dry_run else "each completed step was committed"
                raise MaintenanceError(
                    f"maintenance step {name!r} failed ({exc}); steps completed: {done}; {outcome}: fix the cause, "
                    "then run `emelex memory maintain` again",
                    report,
                ) from exc
            report.steps_completed.append(name)

    def _fail_stale_leases(self, report: MaintenanceReport, now: float) -> None:
        """Step 1, one transaction."""
        batch = self._db.settings.maintain_batch
        with self._db.write() as conn:  # select, then update by key: the planner never scans the table for the IN list
            stale = conn.execute(
                "SELECT session_id FROM session_leases WHERE state = 'active' AND expires_at <= ? "
                "ORDER BY expires_at LIMIT ?", (now, batch),
            ).fetchall()
            conn.executemany(
                "UPDATE session_leases SET state = 'failed', failure = 'expired', ended_at = ? WHERE session_id = ?",
                [(now, rowid) for (rowid,) in stale],
            )
        report.leases_failed = len(stale)
        report.more |= report.leases_failed == batch

    def _rescue_claims(self, report: MaintenanceReport) -> None:
        """Step 2, one transaction per rescue batch."""
        batch = self._db.settings.maintain_batch
        while report.jobs_rescued < batch:
            rescued = self._jobs.rescue_expired_jobs()
            report.jobs_rescued += rescued
            if rescued < RESCUE_BATCH:
                break
        else:
            report.more = True

    def _tombstone_stale(self, report: MaintenanceReport, now: float) -> None:
        """Step 4, one transaction."""
        s = self._db.settings
        if s.knowledge_retention_days <= 0:
            return
        with self._db.write() as conn:
            rows = conn.execute(
                "SELECT id, head_version, tombstoned_at, pinned, key FROM knowledge WHERE pinned = 0 "
                "AND tombstoned_at IS NULL AND updated_at < ? ORDER BY updated_at, id LIMIT ?",
                (now - s.knowledge_retention_days * DAY_S, s.maintain_batch),
            ).fetchall()
            for row in rows:
                tombstone_version(conn, row[:4], row[4], "retention", self._db.clock())
        report.knowledge_tombstoned = len(rows)
        report.more |= len(rows) == s.maintain_batch

    def _purge_tombstones(self, report: MaintenanceReport, now: float) -> None:
        """Step 5, one transaction."""
        s = self._db.settings
        with self._db.write() as conn:
            purged = conn.execute(
                "SELECT id FROM knowledge WHERE tombstoned_at < ? AND pinned = 0 ORDER BY tombstoned_at LIMIT ?",
                (now - s.knowledge_grace_days * DAY_S, s.maintain_batch),
            ).fetchall()
            conn.executemany("DELETE FROM knowledge WHERE id = ?", purged)
        report.knowledge_purged = len(purged)
        report.more |= report.knowledge_purged == s.maintain_batch

    def _prune_versions(self, report: MaintenanceReport, now: float) -> None:
        """Step 6, one transaction. Only entries storing more than `knowledge_keep_versions` versions are read (the
        `knowledge_prunable` index); each pruned entry's `first_version` then moves to its oldest remaining one."""
        s = self._db.settings
        keep = s.knowledge_keep_versions
        with self._db.write() as conn:
            pruned = conn.execute(  # CROSS JOIN: read the few prunable entries first, then their old versions
                "SELECT v.id, k.id FROM knowledge k "
                "CROSS JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version BETWEEN k.first_version "
                "AND k.head_version - ?1 "
                "JOIN knowledge_versions n ON n.knowledge_id = k.id AND n.version = v.version + 1 "
                "WHERE k.pinned = 0 AND k.head_version - k.first_version >= ?1 AND n.created_at < ?2 "
                "ORDER BY v.id LIMIT ?3",
                (keep, now - s.knowledge_grace_days * DAY_S, s.maintain_batch),
            ).fetchall()
            conn.executemany("DELETE FROM knowledge_versions WHERE id = ?", [(vid,) for vid, _ in pruned])
            conn.executemany(
                "UPDATE knowledge SET first_version = (SELECT min(version) FROM knowledge_versions "
                "WHERE knowledge_id = ?1) WHERE id = ?1",
                [(k,) for k in dict.fromkeys(kid for _, kid in pruned)],
            )
        report.versions_pruned = len(pruned)
        report.more |= report.versions_pruned == s.maintain_batch

    def _bound_model_states(self, report: MaintenanceReport, now: float) -> None:
        """Step 7, one transaction."""
        s = self._db.settings
        with self._db.write() as conn:
            report.model_states_removed = collect_model_states(
                conn, now, keep=s.model_states_keep, max_bytes=s.model_states_max_bytes, limit=s.maintain_batch)
        report.more |= report.model_states_removed == s.maintain_batch

    def _collect_unreferenced(self, report: MaintenanceReport, now: float) -> None:
        """Step 8, as `collect_assets` commits; its folder scans only when due (`assets/collection.py:
        folder_scan_due`)."""
        with self._db.read() as conn:
            scan = folder_scan_due(conn, now)
        limit = min(self._db.settings.maintain_batch, self._db.settings.max_page_items)
        collected = self._assets.collect_assets(limit=limit, scan_folder=scan)
        if scan and not report.dry_run:
            with self._db.write() as conn:
                schedule_folder_scan(conn, now)
        report.asset_entries_removed += collected.removed_entries
        report.asset_files_removed += collected.removed_files
        report.asset_bytes_freed += collected.freed_bytes
        report.more |= collected.more

    def _retain_sessions(self, report: MaintenanceReport, now: float, *, remove_files: bool) -> None:
        """Step 3: delete idle, not busy Sessions without an open agent journal in one transaction; then, when
        `remove_files`, the files of the assets only they referenced."""
        s = self._db.settings
        if s.session_retention_days <= 0:
            return
        digests: list[str] = []
        with self._db.write() as conn:
            rows = conn.execute(
                "SELECT s.id, s.uuid FROM session_heads s WHERE s.updated_at < ? "
                f"AND NOT EXISTS (SELECT 1 FROM session_leases l WHERE l.session_id = s.id AND {live_lease('l')}) "
                "AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.session_id = s.id AND j.state = 'claimed' "
                "AND j.lease_expires_at > ?) "
                f"AND NOT {open_journal('s.id')} "  # nor an open agent journal
                "ORDER BY s.updated_at, s.id LIMIT ?",
                (now - s.session_retention_days * DAY_S, now, now, s.maintain_batch),
            ).fetchall()
            for rowid, session_id in rows:
                deletion, emptied = delete_session_in(conn, rowid, session_id, now)
                digests.extend(emptied)
                report.asset_entries_removed += deletion.asset_entries
        report.sessions_deleted = len(rows)
        report.more |= len(rows) == s.maintain_batch
        if remove_files:  # the deletion has committed
            removed = remove_asset_files(self._db, list(dict.fromkeys(digests)))
            report.asset_files_removed += removed.removed_files
            report.asset_bytes_freed += removed.freed_bytes

    def _maintain_file(self, report: MaintenanceReport, vacuum: bool) -> None:
        """Step 8, outside any transaction: optimize, optionally VACUUM, then truncate the WAL."""
        with self._db.read() as conn:
            conn.execute("PRAGMA optimize").fetchall()
            report.optimized = True
            if vacuum:
                conn.execute("VACUUM").fetchall()
                report.vacuumed = True
            busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0]
            report.wal_truncated = busy == 0
