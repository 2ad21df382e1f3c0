"""put_asset's last step, removing its temporary file, cannot undo a put that committed (issue 18, item 6): "raising
means nothing was written". A failed removal after the commit returns the ref with a `LeftoverTempFileWarning`;
one after a failed put never replaces the error that stopped it. The failure is a real `os.unlink` raising EIO on
the temporary file (tests run as root and cannot make a disk fail)."""

from __future__ import annotations

import errno
import hashlib
import os
import warnings

import pytest

from emelex_memory import AssetTamperedError, LeftoverTempFileWarning, MemoryStore
from emelex_memory.assets.files import TEMP_SUFFIX


@pytest.fixture
def failing_temp_unlink(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every `os.unlink` of an asset temporary file fail with EIO; return the names it refused."""
    real, refused = os.unlink, []

    def unlink(path, *args, **kwargs):
        if os.fsdecode(path).endswith(TEMP_SUFFIX):
            refused.append(os.fsdecode(path))
            raise OSError(errno.EIO, os.strerror(errno.EIO), path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    return refused


def test_a_put_whose_temporary_file_cannot_be_removed_still_succeeds_with_a_warning(
    store: MemoryStore, failing_temp_unlink: list[str]
):
    data = b"a picture" * 100
    with pytest.warns(LeftoverTempFileWarning) as caught:
        ref = store.put_asset(data, "image/png")
    assert failing_temp_unlink
    message = str(caught[0].message)
    assert ref.digest in message and "emelex memory maintain" in message
    assert store.read_asset(ref) == data  # stored and catalogued
    assert [p.name for p in (store.asset_dir / "tmp").iterdir()] == failing_temp_unlink  # left for collection


def test_a_failed_removal_never_replaces_the_error_of_a_failed_put(store: MemoryStore, failing_temp_unlink: list[str]):
    data = b"the real bytes"
    with pytest.warns(LeftoverTempFileWarning):
        store.put_asset(b"creates the folders", "image/png")
    planted = store.asset_dir / hashlib.sha256(data).hexdigest()
    fd = os.open(planted, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"other bytes!!!")  # same length, other content: the digest name is taken by a tampered file
    os.close(fd)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AssetTamperedError):
            store.put_asset(data, "image/png")
    assert failing_temp_unlink
    assert [a.ref.digest for a in store.list_assets().assets] == [hashlib.sha256(b"creates the folders").hexdigest()]
