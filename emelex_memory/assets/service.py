"""`AssetStore` (`store.assets`): put, read, list, verify and collect assets."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path


from .refs import (
    DEFAULT_GRACE_S,
    MAX_ASSET_BYTES,
    AssetRef,
    asset_dir_for,
    check_digest,
    check_media_kind,
)
from .catalog import (
    MAX_ENTRY_BYTES,
    MAX_LINK_BYTES,
    AssetLinkPage,
    AssetPage,
    AssetTotals,
    AssetVerification,
    check_catalogued,
    links_of,
    page_entries,
    totals,
    verify_page,
)
from .folder import AssetFolder, open_asset_folder
from .files import (
    AssetSource,
    TempAsset,
    VerifiedAssetReader,
    check_content,
    open_checked,
    read_verified,
    signature,
    verify_file,
    write_temp,
)
from .collection import (
    TEMP_SCAN_KEY,
    AssetCollection,
    collect_entries,
    collect_orphans,
    collect_temps,
    remove_unnamed_files,
    save_scan_position,
)
from ..core.directories import Directory
from ..core.database import Database
from ..errors import (
    AssetMissingError,
    CommitOutcomeUnknownError,
    EmelexError,
    InvalidAssetError,
    InvalidInputError,
    LeftoverTempFileWarning,
)
from ..core.io_errors import restated, translating, with_committed

DEFAULT_VERIFY_BYTES = 1024 * 1024 * 1024  # bytes re-hashed by one `verify_assets` page


class AssetStore:
    """Content-addressed media: `store.assets`. See `assets/refs.py` for the layout."""

    def __init__(self, db: Database) -> None:
        """Serve `db`'s asset folder."""
        self._db = db

    @property
    def asset_dir(self) -> Path:
        """This database's asset folder: `memory/assets` for the standard database, else `<name>.assets` beside it."""
        return asset_dir_for(self._db.path)

    # -- writing --------------------------------------------------------------

    def put_asset(self, data: AssetSource, media_kind: str) -> AssetRef:
        """Store bytes once under their SHA-256 and catalog them with `media_kind`; return the `AssetRef`.

        `data` is bytes, a binary file object (read in 1 MiB chunks) or an
        iterable of bytes chunks. It streams through a 128 MiB cap into a
        locked mode-0600 temporary file that is fsynced, then, holding the
        database write lock, hard-linked under its digest name (never
        overwriting) with the folder fsynced, and catalogued. When the digest
        file already exists its content is verified before it is catalogued;
        a file with other content raises `AssetTamperedError`. Putting the
        same bytes again stores nothing new and refreshes the entry's grace
        period. Any error removes the temporary file and leaves no catalog
        entry (a file linked just before a failed commit is an orphan that
        the next put adopts or collection removes after the grace period),
        except `CommitOutcomeUnknownError`: the commit itself failed and the
        entry may or may not be durable; putting the bytes again is safe.
        Once the entry is committed the put succeeds: if only the removal of
        the temporary file fails then, it returns the ref and warns with a
        `LeftoverTempFileWarning` (collection removes the file later).
        """
        check_media_kind(media_kind)
        with open_asset_folder(self._db, create=True, tmp=True) as folder:
            files, tmp = folder.require(), folder.tmp
            assert tmp is not None  # created with the folder
            temp = write_temp(tmp, data, MAX_ASSET_BYTES)
            try:
                ref = AssetRef(temp.digest, temp.size, media_kind)
                seen = self._existing(files, ref)  # hash an existing file before taking the write lock
                try:
                    with self._db.write() as conn:
                        self._publish(temp, files, ref, seen)
                        now = self._db.clock()
                        conn.execute(
                            "INSERT INTO assets (digest, media_kind, size, created_at, touched_at) "
                            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (digest, media_kind) DO UPDATE SET "
                            "touched_at = max(touched_at, excluded.touched_at)",
                            (ref.digest, ref.media_kind, ref.size, now, now),
                        )
                except CommitOutcomeUnknownError as exc:
                    raise restated(
                        exc, self._db.path, f"asset {ref.digest} ({ref.media_kind})",
                        "put the same bytes again; put_asset is idempotent",
                    ) from exc.__cause__
            except BaseException:
                try:
                    temp.discard()
                except EmelexError:
                    pass  # the error that stopped the put is the one to report; collection removes the file
                raise
            try:
                temp.discard()
            except EmelexError as exc:  # the asset is stored and catalogued: that is not undone by a stray file
                warnings.warn(LeftoverTempFileWarning(
                    f"asset {ref.digest} was stored, but its temporary file could not be removed ({exc}); "
                    "`emelex memory maintain` removes it once it is an hour old"
                ), stacklevel=2)
        return ref

    @staticmethod
    def _existing(files: Directory, ref: AssetRef) -> tuple[int, ...] | None:
        try:
            return signature(verify_file(files, ref.digest, ref.size))
        except AssetMissingError:
            return None

    @staticmethod
    def _publish(temp: TempAsset, files: Directory, ref: AssetRef, seen: tuple[int, ...] | None) -> None:
        """Under the write lock: link the temporary file to its digest name, or re-check the file already there; then
        fsync the folder, so the entry the commit catalogues names a durable file."""
        for _ in range(2):
            try:
                temp.tmp.link(temp.name, files, ref.digest)
            except FileExistsError:
                current = files.stat(ref.digest)
                if current is None:
                    continue  # removed by hand between the two calls: link again
                if signature(current) != seen:
                    verify_file(files, ref.digest, ref.size)
            files.fsync()  # a file adopted from a put cut short may not be durable in the folder yet
            return
        raise AssetMissingError(
            f"asset file {files.path / ref.digest} keeps disappearing while being published; check what removes it"
        )

    # -- reading --------------------------------------------------------------

    def _catalogued(self, ref: AssetRef) -> AssetFolder:
        """Check `ref` against the catalog; return the open asset folder holding its file (close it)."""
        if not isinstance(ref, AssetRef):
            raise InvalidAssetError(f"expected an AssetRef, got {type(ref).__name__}")
        with self._db.read() as conn:
            check_catalogued(conn, ref)
        return open_asset_folder(self._db)

    def read_asset(self, ref: AssetRef) -> bytes:
        """Return an asset's bytes after checking its catalog entry, file type, owner, mode, size and SHA-256.

        Raises `AssetNotFoundError`/`AssetMismatchError` for a ref the catalog
        does not hold, `AssetMissingError` for a missing file and
        `AssetTamperedError` (naming the asset) for any other mismatch.
        """
        with self._catalogued(ref) as folder:
            return read_verified(folder.require(), ref.digest, ref.size)

    def open_asset(self, ref: AssetRef) -> VerifiedAssetReader:
        """Open an asset as a binary stream, fully verified like `read_asset` before it is returned.

        The stream re-hashes what it reads; if the file changed after opening,
        the read that reaches the end raises `AssetTamperedError`.
        """
        with self._catalogued(ref) as folder:
            file = open_checked(folder.require(), ref.digest, ref.size)
        path = self.asset_dir / ref.digest
        try:
            check_content(file, ref.digest, ref.size, path)
            file.seek(0)
        except BaseException:
            file.close()
            raise
        return VerifiedAssetReader(file, ref.digest, ref.size, path)

    def asset_entries(
        self, digest: str, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> AssetPage:
        """Page through the catalog entries of `digest` (one per media kind it was stored as), in media kind order.

        Bounded like `list_assets`; the page is empty when the digest is not
        catalogued. A cursor must come from a page of the same digest.
        """
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_ENTRY_BYTES)
        with self._db.read() as conn:
            return page_entries(conn, cursor, limit, max_bytes, digest)

    def asset_links(
        self, digest: str, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> AssetLinkPage:
        """Page through the events that link `digest`, in Session and seq order, bounded in items and bytes.

        `max_bytes` must leave room for the largest link (`MAX_LINK_BYTES`);
        pass `next_cursor` back until it is None.
        """
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_LINK_BYTES)
        with self._db.read() as conn:
            return links_of(conn, digest, cursor, limit, max_bytes)

    def list_assets(
        self, *, cursor: str | None = None, limit: int | None = None, max_bytes: int | None = None
    ) -> AssetPage:
        """Page through catalog entries in (digest, media kind) order, bounded in items and bytes.

        `max_bytes` must leave room for the largest entry (`MAX_ENTRY_BYTES`,
        else `InvalidInputError`), so every page holds at least one entry and
        has a `next_cursor` whenever more entries follow.
        """
        limit, max_bytes = self._db.page_limits(limit, max_bytes, min_bytes=MAX_ENTRY_BYTES)
        with self._db.read() as conn:
            return page_entries(conn, cursor, limit, max_bytes)

    def asset_totals(self) -> AssetTotals:
        """Catalog entries, distinct files and their bytes."""
        with self._db.read() as conn:
            return totals(conn)

    def verify_assets(
        self, *, cursor: str | None = None, limit: int | None = None, max_hash_bytes: int | None = None
    ) -> AssetVerification:
        """Re-hash one bounded page of catalogued files and report every problem found; never raises for them.

        A page covers at most `limit` entries and stops before `max_hash_bytes`
        (default 1 GiB) of hashing, always checking at least one file. Pass
        `next_cursor` back until it is None to check everything.
        """
        limit, _ = self._db.page_limits(limit, None)
        budget = DEFAULT_VERIFY_BYTES if max_hash_bytes is None else max_hash_bytes
        if type(budget) is not int or budget < 1:
            raise InvalidInputError(f"max_hash_bytes must be a positive integer, got {max_hash_bytes!r}")
        with open_asset_folder(self._db) as folder, self._db.read() as conn:
            return verify_page(conn, folder, cursor, limit, budget)

    # -- collection -------------------------------------------------------------

    @translating("collecting assets", lambda self, **_: self.asset_dir)
    def collect_assets(
        self,
        *,
        limit: int = 1000,
        grace_s: float = DEFAULT_GRACE_S,
        digests: Iterable[str] | None = None,
        scan_folder: bool = True,
    ) -> AssetCollection:
        """Collect unreferenced assets, bounded; return what was done (call again while `.more`).

        Deletes up to `limit` catalog entries that no event links and that were
        not put or linked within `grace_s` seconds, removing a file once no
        entry names it; removes up to `limit` digest-named files that no entry
        names and that are older than `grace_s` (crash orphans); and examines
        up to `limit` temporary files, removing those older than one hour that
        no writer holds locked. Files and temporary files are scanned from a
        saved position, so successive calls reach every one. `digests`
        restricts the call to those digests (e.g. the ones a deleted Session
        linked) and skips temporary files. `scan_folder=False` skips the
        orphan and temporary-file scans, the only part that lists the folder
        (`maintain` paces them, see `assets_gc.folder_scan_due`).

        Safe to call from another process at any time. Called outside a
        transaction, catalog entries are deleted in one write transaction and
        only once it has committed are their files removed, in another, after
        re-checking that no entry names them (see `assets_gc`): a crash or a
        failed commit leaves at worst orphan files, never an entry without its
        file. Called inside a caller's `_write()` transaction, it only deletes
        catalog entries, as part of that transaction (they come back if it
        rolls back), and leaves their files to a later call made outside a
        transaction (counted in `deferred_files`). An error in the file step
        is raised after the entries' deletion committed, and says so.
        """
        if type(limit) is not int or not 1 <= limit <= self._db.settings.max_page_items:
            raise InvalidInputError(f"limit must be between 1 and {self._db.settings.max_page_items}, got {limit!r}")
        if not isinstance(grace_s, (int, float)) or not math.isfinite(grace_s) or grace_s < 0:
            raise InvalidInputError(f"grace_s must be a finite number of seconds >= 0, got {grace_s!r}")
        targets = None if digests is None else list(dict.fromkeys(_checked_digests(digests)))
        if targets is not None and len(targets) > limit:
            raise InvalidInputError(f"at most limit={limit} digests per call, got {len(targets)}")
        report = AssetCollection()
        now = self._db.clock()
        with open_asset_folder(self._db, tmp=True) as folder, self._db.read() as conn:  # holds the store's lock across the steps
            nested = conn.in_transaction
            with self._db.write() as conn:
                emptied = collect_entries(conn, now - grace_s, limit, targets, report)
            if nested:
                report.deferred_files += len(emptied)
                return report
            if folder.files is None:
                return report
            try:
                with self._db.write() as conn:  # the deletion has committed: the files are orphans now
                    remove_unnamed_files(conn, folder.files, emptied, report)
                    if scan_folder:
                        collect_orphans(conn, folder.files, now, grace_s, limit, targets, report)
            except EmelexError as exc:
                raise with_committed(
                    exc, f"{report.removed_entries} unreferenced catalog entries were deleted all the same (that had "
                    "committed); their files stay as orphans that the next collection removes"
                ) from exc
            if scan_folder and targets is None and folder.tmp is not None:
                position = collect_temps(conn, folder.tmp, now, limit, report)
                if position is not None:
                    with self._db.write() as conn:
                        save_scan_position(conn, TEMP_SCAN_KEY, position)
        return report


def _checked_digests(digests: Iterable[str]) -> Iterator[str]:
    if isinstance(digests, str):
        raise InvalidInputError("digests must be an iterable of digest strings, not one string")
    for digest in digests:
        yield check_digest(digest)


def remove_asset_files(db: Database, digests: list[str]) -> AssetCollection:
    """After the commit that deleted the last catalog entries of `digests`: remove their files, bounded per
    transaction, re-checking under the write lock that no entry names them again (see `assets/collection.py`)."""
    report = AssetCollection()
    with open_asset_folder(db) as folder:
        if folder.files is None:
            return report
        step = db.settings.max_page_items
        for i in range(0, len(digests), step):
            with db.write() as conn:
                remove_unnamed_files(conn, folder.files, digests[i : i + step], report)
    return report
