"""The settings the workers, the agent and the plugins are given: `WorkerSettings`, pointing at `home` and
ignoring the caller's environment (the core's tests get the core's `Settings`, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from emelex_workers.settings import WorkerSettings


@pytest.fixture
def settings(home: Path) -> WorkerSettings:
    """WorkerSettings pointing at `home`."""
    return WorkerSettings(home=home)
