"""`delete_session` counts the assets only that Session used that it left, within the asset grace period, for a
later `emelex memory maintain`; `sessions delete` reports them in text and JSON."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, NewEvent, Settings
from emelex_workers.cli import app

from ..support import Clock


@pytest.fixture
def clock() -> Clock:
    """Starting at the real time (asset files age by their real timestamps)."""
    return Clock(time.time())


def _seed(store: MemoryStore, workspace: Path, *assets) -> str:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        lease.replay()
        lease.append_turn([NewEvent("user", {"text": "look"}, assets=tuple(assets))])
        lease.release()
    return session.id


def test_an_asset_within_the_grace_period_is_counted_as_left(cstore, workspace, clock) -> None:
    shared = cstore.put_asset(b"shared", "image/png")
    own = cstore.put_asset(b"only the doomed Session's", "image/png")
    _seed(cstore, workspace, shared)
    doomed = _seed(cstore, workspace, shared, own)
    deletion = cstore.delete_session(doomed)
    assert (deletion.asset_entries, deletion.assets_left) == (0, 1)  # the shared one is still used: not left
    assert cstore.read_asset(own) == b"only the doomed Session's"


def test_past_the_grace_period_nothing_is_left(cstore, workspace, clock) -> None:
    own = cstore.put_asset(b"only the doomed Session's", "image/png")
    doomed = _seed(cstore, workspace, own)
    clock.now += 3601
    deletion = cstore.delete_session(doomed)
    assert (deletion.asset_entries, deletion.assets_left) == (1, 0)


def test_the_cli_reports_the_assets_left(monkeypatch, home, workspace) -> None:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    with MemoryStore.open(Settings()) as store:
        first = _seed(store, workspace, store.put_asset(b"one", "image/png"))
        second = _seed(store, workspace, store.put_asset(b"two", "image/png"))
    text = CliRunner().invoke(app, ["memory", "sessions", "delete", first, "--yes"])
    assert text.exit_code == 0, text.output
    assert "0 assets (0 bytes freed), 1 asset left for `emelex memory maintain` after the grace period" in text.output
    as_json = CliRunner().invoke(app, ["memory", "sessions", "delete", second, "--yes", "--json"])
    assert json.loads(as_json.output)["assets_left"] == 1
