"""Content-addressed media assets: `AssetRef`, where the bytes live, and the catalog schema.

Bytes are stored once, in a file named by their lowercase SHA-256 hex digest,
in the asset folder of the database: `<home>/memory/assets/` for the standard
database (however it is opened), or a sibling `<database-name>.assets/` for any
other database, so independent catalogs never collect each other's files.
Files being written live in the folder's `tmp/` subfolder. The catalog
(table `assets`) holds one entry per (digest, media kind); events link entries
through `event_assets` in the transaction that appends them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidAssetError
from ..core.settings import MiB

MAX_ASSET_BYTES = 128 * MiB  # the write cap of one asset
MAX_REPLAY_MEDIA_BYTES = 256 * MiB  # media referenced by one replay page (and so by one event)
MAX_ASSETS_PER_EVENT = 64
TEMP_MIN_AGE_S = 3600.0  # collection never removes a temporary file younger than this
DEFAULT_GRACE_S = 3600.0  # unreferenced entries and orphaned files are kept this long
STANDARD_DATABASE_NAME = "emelex.sqlite3"  # the file name of `Settings.database_path`

_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_MEDIA_KIND = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}\Z")


def check_digest(digest: object) -> str:
    """Return `digest` if it is a lowercase SHA-256 hex string; raise `InvalidAssetError` otherwise."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise InvalidAssetError(f"asset digest {digest!r} is not 64 lowercase hex characters (a SHA-256)")
    return digest


def check_media_kind(media_kind: object) -> str:
    """Return `media_kind` if it is a lowercase `type/subtype` like `image/png`; raise `InvalidAssetError` otherwise."""
    if not isinstance(media_kind, str) or not _MEDIA_KIND.match(media_kind):
        raise InvalidAssetError(
            f"media kind {media_kind!r} is not a lowercase type/subtype without parameters, like image/png"
        )
    return media_kind


@dataclass(frozen=True, slots=True)
class AssetRef:
    """An immutable reference to stored bytes: SHA-256 `digest` (lowercase hex), `size` in bytes, `media_kind`.

    Obtain one from `MemoryStore.put_asset`; attach it to `NewEvent.assets`.
    Construction validates every field and raises `InvalidAssetError`.
    """

    digest: str
    size: int
    media_kind: str

    def __post_init__(self) -> None:
        check_digest(self.digest)
        if type(self.size) is not int or not 0 <= self.size <= MAX_ASSET_BYTES:
            raise InvalidAssetError(f"asset size {self.size!r} is not an integer between 0 and {MAX_ASSET_BYTES}")
        check_media_kind(self.media_kind)


def asset_dir_for(database: Path) -> Path:
    """The asset folder of `database`, decided by its path alone so that every way of opening it agrees.

    A database named `emelex.sqlite3` in a folder named `memory` (the standard
    `<home>/memory/emelex.sqlite3`, whether opened with `MemoryStore.open` or
    `open_path`) uses `memory/assets`; any other uses `<name>.assets` beside it.
    """
    if database.name == STANDARD_DATABASE_NAME and database.parent.name == "memory":
        return database.parent / "assets"
    return database.with_name(f"{database.name}.assets")


def temp_dir_of(folder: Path) -> Path:
    """The subfolder of an asset folder holding files still being written."""
    return folder / "tmp"

