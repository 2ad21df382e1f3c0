"""Assets: capped streaming writes, content addressing, verified reads, planted files and symlinks."""

from __future__ import annotations

import array
import hashlib
import io
import os
import stat
from pathlib import Path

import pytest

from emelex_memory import (
    MAX_ASSET_BYTES,
    AssetError,
    AssetLinkMismatchError,
    AssetMismatchError,
    AssetMissingError,
    AssetNotFoundError,
    AssetRef,
    AssetTamperedError,
    AssetTooLargeError,
    InsecurePathError,
    InvalidAssetError,
    InvalidInputError,
    MemoryStore,
    Settings,
    StoreError,
)
from emelex_memory.assets import files as assets_files
from emelex_memory.assets.catalog import MAX_ENTRY_BYTES

from ..support import file_state, table_rows

MiB = 1024 * 1024


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tree(folder: Path) -> dict[str, tuple]:
    """Every entry under an asset folder, `tmp/` included, without following symlinks."""
    out = {name: value for name, value in file_state(folder).items() if name != "tmp"}
    out.update({f"tmp/{name}": value for name, value in file_state(folder / "tmp").items()})
    return out


def test_bytes_round_trip_into_a_private_sibling_folder(store: MemoryStore, db_path: Path) -> None:
    data = b"\x89PNG\r\n\x1a\n" + os.urandom(5000)
    ref = store.put_asset(data, "image/png")
    assert ref == AssetRef(_sha(data), len(data), "image/png")
    assert store.asset_dir == db_path.with_name("test.sqlite3.assets")
    assert store.read_asset(ref) == data
    with store.open_asset(ref) as stream:
        assert stream.read() == data
    st = os.lstat(store.asset_dir / ref.digest)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid() and st.st_nlink == 1
    for folder in (store.asset_dir, store.asset_dir / "tmp"):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert os.listdir(store.asset_dir / "tmp") == []
    assert store.asset_entries(ref.digest).assets[0].ref == ref


def test_standard_database_keeps_assets_in_memory_assets(settings: Settings, tmp_path: Path) -> None:
    with MemoryStore.open(settings) as store:
        ref = store.put_asset(b"standard", "text/plain")
        assert store.asset_dir == settings.home_dir / "memory" / "assets"
        assert (settings.home_dir / "memory" / "assets" / ref.digest).is_file()
    other = settings.memory_dir / "other.sqlite3"
    with MemoryStore.open_path(other, settings) as store:
        assert store.asset_dir == settings.memory_dir / "other.sqlite3.assets"
        store.put_asset(b"standard", "text/plain")
        report = store.collect_assets(grace_s=0)
        assert report.removed_files == 1  # its own copy only
    assert (settings.home_dir / "memory" / "assets" / ref.digest).is_file()


def test_large_file_streams_in_and_out(store: MemoryStore, tmp_path: Path) -> None:
    source = tmp_path / "video.bin"
    block = os.urandom(MiB)
    with open(source, "wb") as f:
        for i in range(40):
            f.write(bytes([i]) + block[1:])
    expected = hashlib.sha256(source.read_bytes()).hexdigest()
    with open(source, "rb") as f:
        ref = store.put_asset(f, "video/mp4")
    assert (ref.digest, ref.size) == (expected, 40 * MiB)
    again = store.put_asset((bytes([i]) + block[1:] for i in range(40)), "video/mp4")
    assert again == ref
    hasher, total = hashlib.sha256(), 0
    with store.open_asset(ref) as stream:
        while chunk := stream.read(3 * MiB + 7):
            hasher.update(chunk)
            total += len(chunk)
    assert (hasher.hexdigest(), total) == (expected, 40 * MiB)


def test_exactly_the_cap_is_accepted(store: MemoryStore) -> None:
    ref = store.put_asset((bytes(MiB) for _ in range(MAX_ASSET_BYTES // MiB)), "application/octet-stream")
    assert ref.size == MAX_ASSET_BYTES


def test_a_write_over_the_cap_leaves_nothing_behind(store: MemoryStore, db_path: Path) -> None:
    store.put_asset(b"already here", "text/plain")
    rows, files = table_rows(db_path), _tree(store.asset_dir)
    with pytest.raises(AssetTooLargeError, match="128 MiB"):
        store.put_asset((bytes(MiB) for _ in range(MAX_ASSET_BYTES // MiB + 1)), "application/octet-stream")

    class EndlessStream(io.RawIOBase):
        """A readable stream that never ends; counts what was taken from it."""

        taken = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            self.taken += len(buffer)
            return len(buffer)

    endless = EndlessStream()
    with pytest.raises(AssetTooLargeError):
        store.put_asset(io.BufferedReader(endless), "application/octet-stream")
    assert endless.taken <= MAX_ASSET_BYTES + 2 * assets_files.CHUNK_BYTES  # stopped reading at the cap
    assert table_rows(db_path) == rows
    assert _tree(store.asset_dir) == files


def test_same_content_is_stored_once(db_path: Path, settings: Settings) -> None:
    now = [1000.0]
    store = MemoryStore.open_path(db_path, settings, clock=lambda: now[0])
    first = store.put_asset(b"same bytes", "text/plain")
    now[0] = 2000.0
    second = store.put_asset([b"same ", b"bytes"], "text/plain")
    assert first == second
    [entry] = store.asset_entries(first.digest).assets
    assert (entry.created_at, entry.touched_at) == (1000.0, 2000.0)
    as_markdown = store.put_asset(b"same bytes", "text/markdown")
    kinds = [e.ref.media_kind for e in store.asset_entries(first.digest).assets]
    assert kinds == ["text/markdown", "text/plain"]
    assert store.read_asset(as_markdown) == b"same bytes"
    assert sorted(os.listdir(store.asset_dir)) == sorted([first.digest, "tmp"])
    assert os.lstat(store.asset_dir / first.digest).st_nlink == 1
    store.close()


def test_a_planted_file_with_wrong_content_is_detected(store: MemoryStore, db_path: Path) -> None:
    data = b"the real bytes"
    store.put_asset(b"unrelated", "text/plain")  # creates the folder
    planted = store.asset_dir / _sha(data)
    fd = os.open(planted, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"evil bytes!!!!")  # same length, different content
    os.close(fd)
    rows, files = table_rows(db_path), _tree(store.asset_dir)
    with pytest.raises(AssetTamperedError, match=_sha(data)):
        store.put_asset(data, "text/plain")
    assert table_rows(db_path) == rows and _tree(store.asset_dir) == files
    planted.unlink()
    ref = store.put_asset(data, "text/plain")  # moving it away repairs
    assert store.read_asset(ref) == data


def test_a_planted_file_with_the_right_content_is_verified_and_adopted(store: MemoryStore) -> None:
    data = b"recovered after a crash"
    store.put_asset(b"unrelated", "text/plain")
    orphan = store.asset_dir / _sha(data)
    fd = os.open(orphan, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)
    inode = os.lstat(orphan).st_ino
    ref = store.put_asset(data, "text/plain")
    assert os.lstat(orphan).st_ino == inode and store.read_asset(ref) == data


def test_a_symlink_under_the_digest_name_is_refused(store: MemoryStore, db_path: Path, tmp_path: Path) -> None:
    data = b"linked elsewhere"
    store.put_asset(b"unrelated", "text/plain")
    target = tmp_path / "outside"
    target.write_bytes(data)  # even the right content behind a symlink is refused
    os.symlink(target, store.asset_dir / _sha(data))
    rows = table_rows(db_path)
    with pytest.raises(AssetTamperedError, match="symlink"):
        store.put_asset(data, "text/plain")
    assert table_rows(db_path) == rows
    assert target.read_bytes() == data and os.listdir(store.asset_dir / "tmp") == []


def test_a_symlink_replacing_a_catalogued_file_is_refused_on_read(store: MemoryStore, tmp_path: Path) -> None:
    data = b"catalogued"
    ref = store.put_asset(data, "text/plain")
    path = store.asset_dir / ref.digest
    target = tmp_path / "copy"
    target.write_bytes(data)
    os.chmod(target, 0o600)
    path.unlink()
    os.symlink(target, path)
    with pytest.raises(AssetTamperedError, match="symlink"):
        store.read_asset(ref)
    with pytest.raises(AssetTamperedError, match="symlink"):
        store.open_asset(ref)


def test_a_symlink_at_the_temporary_name_is_refused(
    store: MemoryStore, db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put_asset(b"unrelated", "text/plain")
    victim = tmp_path / "victim"
    victim.write_bytes(b"must stay")
    os.symlink(victim, store.asset_dir / "tmp" / "fixed.part")
    monkeypatch.setattr(assets_files, "temp_name", lambda: "fixed.part")  # make the random name predictable
    rows = table_rows(db_path)
    with pytest.raises(AssetTamperedError, match="fixed.part"):
        store.put_asset(b"payload", "text/plain")
    assert victim.read_bytes() == b"must stay" and table_rows(db_path) == rows
    assert os.path.islink(store.asset_dir / "tmp" / "fixed.part")


def test_a_symlinked_temp_folder_is_refused(store: MemoryStore, db_path: Path, tmp_path: Path) -> None:
    store.put_asset(b"unrelated", "text/plain")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.rmdir(store.asset_dir / "tmp")
    os.symlink(elsewhere, store.asset_dir / "tmp")
    rows = table_rows(db_path)
    with pytest.raises(InsecurePathError, match="symlink"):
        store.put_asset(b"payload", "text/plain")
    assert os.listdir(elsewhere) == [] and table_rows(db_path) == rows


def _chown_away(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root (the pretend_other_user case runs as anyone)")
    os.chown(path, 65534, 65534, follow_symlinks=False)


def _pretend_other_user(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file keeps its owner while the checks believe we are someone else."""
    me = os.geteuid()
    monkeypatch.setattr(assets_files, "geteuid", lambda: me + 1)


def _chmod_open(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    os.chmod(path, 0o644)


def _grow(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(path, "ab") as f:
        f.write(b"!")


def _flip(path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)


MOVE_AWAY = "move it away, then put the original bytes again"


@pytest.mark.parametrize(
    ("damage", "finding", "remedy"),
    [(_chown_away, "owned by uid 65534", "chown"),
     (_pretend_other_user, f"owned by uid {os.geteuid()}, not you \\(uid {os.geteuid() + 1}\\)", "chown"),
     (_chmod_open, "mode 0644", "run `chmod 600 "), (_grow, "holds 33 bytes", MOVE_AWAY),
     (_flip, "does not hash", MOVE_AWAY)],
)
def test_a_damaged_file_is_refused_on_read(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch, damage, finding: str, remedy: str
) -> None:
    ref = store.put_asset(b"32 bytes of perfectly good data!", "text/plain")
    damage(store.asset_dir / ref.digest, monkeypatch)
    for read in (store.read_asset, store.open_asset):
        with pytest.raises(AssetTamperedError, match=finding) as err:
            read(ref)
        assert ref.digest in str(err.value) and remedy in str(err.value)
    assert [p.detail for p in store.verify_assets().problems] == [str(err.value)]


def test_a_mode_problem_is_remedied_by_the_chmod_it_names(store: MemoryStore) -> None:
    ref = store.put_asset(b"readable by others", "text/plain")
    path = store.asset_dir / ref.digest
    os.chmod(path, 0o644)
    with pytest.raises(AssetTamperedError, match="chmod 600") as err:
        store.read_asset(ref)
    assert "move it away" not in str(err.value)
    os.chmod(path, 0o600)  # exactly what the message says
    assert store.read_asset(ref) == b"readable by others"


def test_asset_errors_share_one_base() -> None:
    assert issubclass(AssetLinkMismatchError, AssetError)
    assert not issubclass(AssetLinkMismatchError, StoreError)
    for cls in (AssetError, AssetLinkMismatchError, AssetTamperedError):
        assert cls.__doc__ and ":" in cls.__doc__ and "read the message" not in cls.__doc__


def test_a_missing_file_or_unknown_ref_is_refused(store: MemoryStore) -> None:
    ref = store.put_asset(b"will vanish", "text/plain")
    with pytest.raises(AssetNotFoundError):
        store.read_asset(AssetRef(ref.digest, ref.size, "text/html"))
    with pytest.raises(AssetMismatchError):
        store.read_asset(AssetRef(ref.digest, ref.size + 1, ref.media_kind))
    (store.asset_dir / ref.digest).unlink()
    with pytest.raises(AssetMissingError, match="put the same bytes again"):
        store.read_asset(ref)
    assert store.put_asset(b"will vanish", "text/plain") == ref  # putting the bytes again restores it
    assert store.read_asset(ref) == b"will vanish"


def test_a_stream_notices_a_change_after_it_was_opened(store: MemoryStore) -> None:
    ref = store.put_asset(b"A" * 3 * MiB, "application/octet-stream")
    stream = store.open_asset(ref)
    with open(store.asset_dir / ref.digest, "r+b") as f:
        f.seek(2 * MiB)
        f.write(b"B")
    with pytest.raises(AssetTamperedError, match="changed while it was being read"):
        stream.read()
    stream.close()


def test_bad_refs_and_sources_are_refused_before_writing(store: MemoryStore, db_path: Path, tmp_path: Path) -> None:
    for digest, size, kind in [("ab" * 31, 1, "text/plain"), ("AB" * 32, 1, "text/plain"), ("ab" * 32, -1, "a/b"),
                               ("ab" * 32, True, "a/b"), ("ab" * 32, MAX_ASSET_BYTES + 1, "a/b"),
                               ("ab" * 32, 1, "Image/PNG"), ("ab" * 32, 1, "image/png; q=1"), ("ab" * 32, 1, "png")]:
        with pytest.raises(InvalidAssetError):
            AssetRef(digest, size, kind)
    store.put_asset(b"x", "text/plain")
    rows, files = table_rows(db_path), _tree(store.asset_dir)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with open(text) as handle:
        sources = ["a string", 42, [b"ok", "not bytes"], handle]
        for source in sources:
            with pytest.raises(InvalidAssetError):
                store.put_asset(source, "text/plain")
    with pytest.raises(InvalidAssetError, match="type/subtype"):
        store.put_asset(b"data", "not a media kind")
    with pytest.raises(InvalidAssetError):
        store.read_asset("not a ref")  # type: ignore[arg-type]
    assert table_rows(db_path) == rows and _tree(store.asset_dir) == files


def test_listing_pages_with_a_stable_cursor(store: MemoryStore) -> None:
    refs = {store.put_asset(f"asset {i}".encode(), "text/plain") for i in range(7)}
    refs.add(store.put_asset(b"asset 0", "text/markdown"))
    seen, cursor = [], None
    while True:
        page = store.list_assets(cursor=cursor, limit=3)
        assert len(page.assets) <= 3
        seen += [a.ref for a in page.assets]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == sorted(refs, key=lambda r: (r.digest, r.media_kind))
    totals = store.asset_totals()
    assert (totals.entries, totals.files, totals.bytes) == (8, 7, 7 * 7)
    for bad in ("nonsense", "ab" * 32 + ":BAD"):
        with pytest.raises(InvalidInputError):
            store.list_assets(cursor=bad)
    with pytest.raises(InvalidInputError):
        store.list_assets(limit=0)


def test_verification_pages_are_bounded_and_report_every_problem(store: MemoryStore) -> None:
    refs = sorted((store.put_asset(bytes([i]) * 1000, "application/octet-stream") for i in range(6)),
                  key=lambda r: r.digest)
    (store.asset_dir / refs[1].digest).unlink()
    _flip(store.asset_dir / refs[4].digest)
    page = store.verify_assets(limit=10, max_hash_bytes=2500)
    assert (page.checked, page.hashed_bytes) == (3, 2000) and page.next_cursor  # the missing file: nothing hashed
    problems, cursor, checked = list(page.problems), page.next_cursor, page.checked
    while cursor:
        page = store.verify_assets(cursor=cursor, limit=10, max_hash_bytes=2500)
        problems += page.problems
        checked += page.checked
        cursor = page.next_cursor
    assert checked == 6
    assert [(p.digest, "missing" in p.detail or "hash" in p.detail) for p in problems] == [
        (refs[1].digest, True), (refs[4].digest, True)]


def test_a_page_too_small_for_the_largest_entry_is_refused(store: MemoryStore, db_path: Path) -> None:
    longest = "a" * 63 + "/" + "b" * 63  # the longest media kind the catalog accepts
    refs = sorted((store.put_asset(f"entry {i}".encode(), longest) for i in range(3)), key=lambda r: r.digest)
    for too_small in (1, 100, MAX_ENTRY_BYTES - 1):
        with pytest.raises(InvalidInputError, match=f"max_bytes must be between {MAX_ENTRY_BYTES} and"):
            store.list_assets(max_bytes=too_small)
        with pytest.raises(InvalidInputError):
            store.asset_entries(refs[0].digest, max_bytes=too_small)
    seen, cursor = [], None
    for _ in range(10):
        page = store.list_assets(cursor=cursor, max_bytes=MAX_ENTRY_BYTES)
        assert len(page.assets) == 1  # the largest entry fits exactly, and never more than one
        seen += [a.ref for a in page.assets]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == refs


def test_the_entries_of_one_digest_page_with_a_cursor(store: MemoryStore) -> None:
    kinds = [f"text/kind{i}" for i in range(5)]
    for kind in kinds:
        ref = store.put_asset(b"one file, many kinds", kind)
    other = store.put_asset(b"another file", "text/plain")
    seen, cursor = [], None
    for _ in range(10):
        page = store.asset_entries(ref.digest, cursor=cursor, limit=2)
        assert 1 <= len(page.assets) <= 2
        seen += [a.ref.media_kind for a in page.assets]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == kinds
    assert store.asset_entries("c" * 64).assets == [] and store.asset_entries("c" * 64).next_cursor is None
    wrong = store.asset_entries(other.digest).assets[0].ref
    with pytest.raises(InvalidInputError, match="belongs to another asset"):
        store.asset_entries(ref.digest, cursor=f"{wrong.digest}:{wrong.media_kind}")


def test_a_strided_memoryview_is_stored_as_its_bytes(store: MemoryStore) -> None:
    data = os.urandom(3 * MiB + 5)
    ref = store.put_asset(memoryview(data)[::3], "application/octet-stream")  # copied in bounded slices
    assert ref == AssetRef(_sha(data[::3]), len(data[::3]), "application/octet-stream")
    assert store.read_asset(ref) == data[::3]
    words = array.array("i", range(1000))
    ref = store.put_asset([b"head", memoryview(words)[::2]], "application/octet-stream")
    assert store.read_asset(ref) == b"head" + array.array("i", range(0, 1000, 2)).tobytes()


def test_a_strided_multidimensional_memoryview_is_refused(store: MemoryStore, db_path: Path) -> None:
    testbuffer = pytest.importorskip("_testbuffer")
    store.put_asset(b"x", "text/plain")
    rows, files = table_rows(db_path), _tree(store.asset_dir)
    grid = memoryview(testbuffer.ndarray(list(range(12)), shape=[3, 4], format="B"))[::2]
    assert grid.ndim == 2 and not grid.c_contiguous
    with pytest.raises(InvalidAssetError, match="non-contiguous 2-dimensional memoryview; pass view.tobytes"):
        store.put_asset(grid, "application/octet-stream")
    assert table_rows(db_path) == rows and _tree(store.asset_dir) == files
    assert store.read_asset(store.put_asset(grid.tobytes(), "application/octet-stream")) == grid.tobytes()


def test_the_standard_database_maps_to_memory_assets_however_it_is_opened(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(tmp_path / "another-home"))  # default Settings() name another Home
    with MemoryStore.open(settings) as store:
        ref = store.put_asset(b"one catalog, one folder", "text/plain")
    with MemoryStore.open_path(settings.database_path) as by_path:
        assert by_path.asset_dir == settings.memory_dir / "assets"
        assert by_path.read_asset(ref) == b"one catalog, one folder"
        again = by_path.put_asset(b"one catalog, one folder", "text/plain")
    assert again == ref and sorted(os.listdir(settings.memory_dir / "assets")) == sorted([ref.digest, "tmp"])
    assert not any(name.endswith(".assets") for name in os.listdir(settings.memory_dir))
