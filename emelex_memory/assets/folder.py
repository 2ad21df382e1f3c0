"""`AssetFolder`: a store's asset folder and its `tmp/` subfolder, opened for one operation.

Both are opened through the descriptor of the database's directory, which
the store holds from open to close (see `core/directories.py`): swapping that
directory, the asset folder or `tmp/` for a symlink, or renaming any parent,
cannot send an asset write or read anywhere else. A symlink in place of
either folder is refused with `InsecurePathError`.
"""

from __future__ import annotations

from pathlib import Path

from ..core.database import Database
from ..core.directories import Directory
from ..errors import AssetMissingError
from .refs import asset_dir_for, temp_dir_of


class AssetFolder:
    """The open asset folder (`files`, None when it does not exist) and its `tmp/` (`tmp`, None unless asked for
    and present). Close it, or use it as a context manager, when the operation ends."""

    __slots__ = ("path", "files", "tmp")

    def __init__(self, path: Path, files: Directory | None, tmp: Directory | None) -> None:
        """Wrap already opened folders; use `open` instead."""
        self.path = path
        self.files = files
        self.tmp = tmp

    @classmethod
    def open(cls, parent: Directory, path: Path, *, create: bool = False, tmp: bool = False) -> AssetFolder:
        """Open the asset folder `path` (a child of the directory `parent`) and, with `tmp`, its `tmp/`.

        With `create` both are made (mode 0700) when missing. Raises
        `InsecurePathError` when either is a symlink or not private.
        """
        files = parent.child(path.name, create=create)
        try:
            temp = files.child(temp_dir_of(path).name, create=create) if tmp and files is not None else None
        except BaseException:
            if files is not None:
                files.close()
            raise
        return cls(path, files, temp)

    def require(self) -> Directory:
        """The asset folder; `AssetMissingError` when it does not exist."""
        if self.files is None:
            raise AssetMissingError(f"asset folder {self.path} is missing; restore it from a backup")
        return self.files

    def close(self) -> None:
        """Close both folders."""
        for folder in (self.tmp, self.files):
            if folder is not None:
                folder.close()

    def __enter__(self) -> AssetFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_asset_folder(db: Database, *, create: bool = False, tmp: bool = False) -> AssetFolder:
    """Open `db`'s asset folder (and, with `tmp`, its `tmp/`) for one operation, through the descriptor of the
    database's directory held since the store was opened; close it when done. See `AssetFolder.open`."""
    with db.lock:  # not while `close()` closes the directory
        if db.directory.fd < 0:
            raise db.closed_error()
        return AssetFolder.open(db.directory, asset_dir_for(db.path), create=create, tmp=tmp)
