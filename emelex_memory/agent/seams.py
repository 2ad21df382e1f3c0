"""The agent package's only uses of `MemoryStore` internals, gathered here so that restructuring the core
(e.g. into a composed store of a Database and services) changes this file alone.

The private names used: `MemoryStore._write`, `MemoryStore._read`, `MemoryStore._session_rowid` and
`MemoryStore._lease_ttl`. Everything else the agent code calls on the store or a lease is public.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store import MemoryStore


def write(store: MemoryStore) -> AbstractContextManager[Any]:
    """A `BEGIN IMMEDIATE` write transaction on the store's connection (committed on exit, rolled back on error)."""
    return store._write()


def read(store: MemoryStore) -> AbstractContextManager[Any]:
    """A consistent read of the store's connection."""
    return store._read()


def session_rowid(store: MemoryStore, conn: Any, session_id: str) -> int:
    """Inside `read`/`write`: the internal row ID of the public Session ID (`SessionNotFoundError` when unknown)."""
    return store._session_rowid(conn, session_id)


def lease_ttl(store: MemoryStore, ttl_s: float | None) -> float:
    """The Session lease TTL `ttl_s` resolves to (default: the store's setting); `InvalidInputError` when out of
    range."""
    return store._lease_ttl(ttl_s)
