"""Backups and restore on real files: concurrent writer processes, SIGKILL mid-backup, incremental, tampering."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, NewEvent, Settings
from emelex_memory.maintenance.backup import backup_store, restore_backup, verify_backup
from emelex_memory.maintenance.backup_manifest import MANIFEST
from emelex_memory.maintenance.doctor import diagnose
from emelex_memory.errors import (
    BackupDestinationError,
    BackupVerificationError,
    NotABackupError,
    RestoreTargetError,
)

from ..support import file_state

WRITER = textwrap.dedent("""
    import sys, time
    from emelex_memory import MemoryStore, NewEvent, Settings
    home, ws, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with MemoryStore.open(Settings(home=home)) as store:
        s = store.create_session(ws)
        with store.acquire_lease(s.id, ws) as lease:
            list(lease.replay_all())
            print("ready", flush=True)
            for i in range(n):
                lease.append_turn([NewEvent("user", {"text": f"turn {i}"})])
            lease.release()
""")


@pytest.fixture
def live(tmp_path: Path):
    settings = Settings(home=tmp_path / "home")
    ws = tmp_path / "ws"
    ws.mkdir()
    store = MemoryStore.open(settings)
    s = store.create_session(ws)
    with store.acquire_lease(s.id, ws) as lease:
        list(lease.replay_all())
        for i in range(3):
            ref = store.put_asset(f"picture {i}".encode() * 100, "image/png")
            lease.append_turn([NewEvent("user", {"text": f"q{i}"}, assets=(ref,))])
        lease.release()
    yield store, settings, ws
    store.close()


def _events(store: MemoryStore) -> int:
    with store.db.read() as conn:
        return conn.execute("SELECT count(*) FROM events").fetchall()[0][0]


def test_backup_under_concurrent_writers_restores_a_consistent_store(live, tmp_path: Path) -> None:
    store, settings, ws = live
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(settings.home), str(ws), "300"],
                                stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for w in writers:
        assert w.stdout.readline().strip() == "ready"
    report = backup_store(store, tmp_path / "backup")
    for w in writers:
        assert w.wait(timeout=120) == 0
    assert report.assets == 3 and report.assets_copied == 3
    assert oct(os.stat(tmp_path / "backup").st_mode & 0o777) == "0o700"
    assert all(p.stat().st_mode & 0o077 == 0 for p in (tmp_path / "backup").rglob("*"))
    assert verify_backup(tmp_path / "backup").counts == report.counts
    restored = Settings(home=tmp_path / "restored")
    restore_backup(tmp_path / "backup", restored)
    with MemoryStore.open(restored, create=False) as copy:
        assert _events(copy) == report.counts["events"]
        for session in copy.list_sessions().sessions:  # every Session's transcript is whole, assets verified
            page = copy.replay(session.id)
            assert [e.seq for e in page.events] == list(range(1, len(page.events) + 1))
    assert diagnose(restored).healthy
    assert _events(store) == 3 + 600  # the source kept every write


def test_incremental_backup_copies_only_new_assets(live, tmp_path: Path) -> None:
    store, settings, ws = live
    dest = tmp_path / "backup"
    backup_store(store, dest)
    before = {p.name: p.stat().st_mtime_ns for p in (dest / "assets").iterdir()}
    store.put_asset(b"a new picture", "image/png")
    report = backup_store(store, dest)
    assert (report.assets, report.assets_copied) == (4, 1)
    assert all((dest / "assets" / name).stat().st_mtime_ns == t for name, t in before.items())


def test_short_writes_still_copy_every_asset_whole(live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _settings, _ws = live
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))  # a write may be short
    dest = tmp_path / "backup"
    report = backup_store(store, dest)
    monkeypatch.undo()
    assert report.assets == 3
    verify_backup(dest)  # every asset hashes to its name and size
    assert sorted(p.stat().st_size for p in (dest / "assets").iterdir()) == [900, 900, 900]


def test_sigkill_during_backup_leaves_source_whole_and_backup_refused(live, tmp_path: Path) -> None:
    store, settings, ws = live
    dest = tmp_path / "backup"
    backup_store(store, dest)  # a complete backup first: the killed run must not leave it passing for complete
    big = store.put_asset(os.urandom(1 << 20) * 40, "application/octet-stream")
    events_before = _events(store)
    code = textwrap.dedent(f"""
        import os
        from emelex_memory import MemoryStore, Settings
        from emelex_memory.maintenance import backup
        real = backup._copy_asset
        def slow(*a):
            real(*a)
            print("copied", flush=True)
            import time; time.sleep(60)
        backup._copy_asset = slow
        with MemoryStore.open(Settings(home={str(settings.home)!r})) as store:
            backup.backup_store(store, {str(dest)!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "copied"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (dest / MANIFEST).exists()
    with pytest.raises(NotABackupError, match="partial backup"):
        verify_backup(dest)
    with pytest.raises(NotABackupError):
        restore_backup(dest, Settings(home=tmp_path / "restored"))
    assert not (tmp_path / "restored").exists()
    assert diagnose(settings).healthy and _events(store) == events_before
    assert store.read_asset(big)[:16]
    assert backup_store(store, dest).assets == 4  # running it again completes the backup


def test_tampered_asset_is_detected_and_not_restored(live, tmp_path: Path) -> None:
    store, settings, ws = live
    dest = tmp_path / "backup"
    backup_store(store, dest)
    victim = next((dest / "assets").iterdir())
    victim.write_bytes(b"altered")
    with pytest.raises(BackupVerificationError, match="does not hash"):
        verify_backup(dest)
    target = tmp_path / "restored"
    with pytest.raises(BackupVerificationError):
        restore_backup(dest, Settings(home=target))
    assert not target.exists()


def test_restore_refuses_a_non_empty_home_and_changes_nothing(live, tmp_path: Path) -> None:
    store, settings, ws = live
    dest = tmp_path / "backup"
    backup_store(store, dest)
    before = file_state(settings.home)
    with pytest.raises(RestoreTargetError, match="not empty"):
        restore_backup(dest, settings)
    assert file_state(settings.home) == before


@pytest.mark.parametrize("where", ["inside", "around"])
def test_restore_refuses_a_home_that_overlaps_the_backup_and_changes_nothing(live, tmp_path: Path,
                                                                             where: str) -> None:
    store, settings, ws = live
    dest = tmp_path / "backup"
    backup_store(store, dest)
    if where == "inside":  # the Home to restore into is a new folder inside the backup
        home = dest / "home"
    else:  # the backup sits inside the Home
        home = tmp_path / "new"
        home.mkdir()
        dest = dest.rename(home / "backup")
    before = file_state(tmp_path)
    with pytest.raises(RestoreTargetError, match="overlaps the backup"):
        restore_backup(dest, Settings(home=home))
    assert file_state(tmp_path) == before
    verify_backup(dest)


def test_bad_destinations_are_refused_without_change(live, tmp_path: Path) -> None:
    store, settings, ws = live
    with pytest.raises(BackupDestinationError, match="overlaps"):
        backup_store(store, settings.home / "backups")
    assert not (settings.home / "backups").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    with pytest.raises(BackupDestinationError, match="not empty"):
        backup_store(store, full)
    assert [p.name for p in full.iterdir()] == ["notes.txt"]
    with pytest.raises(NotABackupError, match="not a backup"):
        verify_backup(full)


def test_cli_backup_verify_restore(live, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from emelex_workers.cli import app

    store, settings, ws = live
    runner = CliRunner()
    env = {"EMELEX_HOME": str(settings.home)}
    ok = runner.invoke(app, ["memory", "backup", str(tmp_path / "b")], env=env)
    assert ok.exit_code == 0 and "backed up to" in ok.output, ok.output
    assert runner.invoke(app, ["memory", "backup", "--verify", str(tmp_path / "b")], env=env).exit_code == 0
    refused = runner.invoke(app, ["memory", "restore", str(tmp_path / "b")], env=env)
    assert refused.exit_code != 0 and "is not empty" in refused.output and "Traceback" not in refused.output
    done = runner.invoke(app, ["memory", "restore", str(tmp_path / "b")], env={"EMELEX_HOME": str(tmp_path / "r")})
    assert done.exit_code == 0, done.output


def test_an_empty_directory_of_yours_is_made_private_and_backed_up_to(live, tmp_path: Path) -> None:
    store, settings, ws = live
    dest = tmp_path / "e755"
    dest.mkdir(mode=0o755)
    os.chmod(dest, 0o755)
    report = backup_store(store, dest)
    assert oct(os.stat(dest).st_mode & 0o777) == "0o700"
    assert verify_backup(dest).counts == report.counts


def test_a_directory_not_yours_or_a_loose_backup_is_refused_with_a_remedy(live, tmp_path: Path) -> None:
    store, settings, ws = live
    loose = tmp_path / "loose"
    backup_store(store, loose)
    os.chmod(loose, 0o755)
    before = file_state(loose)
    with pytest.raises(BackupDestinationError, match=r"chmod 700 .*loose"):
        backup_store(store, loose)
    assert file_state(loose) == before and os.stat(loose).st_mode & 0o777 == 0o755
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(BackupDestinationError, match="does not exist yet") as refused:
        backup_store(store, theirs)
    assert "make a new backup" not in str(refused.value)
    assert list(theirs.iterdir()) == [] and os.stat(theirs).st_uid == 65534
