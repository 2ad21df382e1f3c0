"""Emelex Memory: the durable, local storage core.

A plain library: it imports neither pluggy, typer nor llama_cpp. Open a store
with `MemoryStore.open(settings)` (the standard location under Emelex Home)
or `MemoryStore.open_path(path)`.
"""

from .errors import (
    ConfirmationRequiredError,
    DatabaseDeletedError,
    DatabaseEmptiedError,
    EmelexError,
    InsecurePathError,
    InvalidEventError,
    InvalidInputError,
    JsonNonFiniteError,
    JsonTooDeepError,
    JsonTooLargeError,
    JsonUnencodableError,
    LeaseError,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    NotAnEmelexDatabaseError,
    ReplayRequiredError,
    ReservedEventKindError,
    SchemaTooNewError,
    SessionNotFoundError,
    StaleCursorError,
    StoreError,
    StoreExistsError,
    WorkspaceError,
    WorkspaceMissingError,
    WorkspaceReplacedError,
)
from .leases import SessionLease
from .sessions import Session, WorkspaceIdentity
from .settings import Settings
from .store import MemoryStore, SessionPage
from .transcript import AppendedTurn, Event, NewEvent, ReplayPage

__all__ = [
    "AppendedTurn",
    "ConfirmationRequiredError",
    "DatabaseDeletedError",
    "DatabaseEmptiedError",
    "EmelexError",
    "Event",
    "InsecurePathError",
    "InvalidEventError",
    "InvalidInputError",
    "JsonNonFiniteError",
    "JsonTooDeepError",
    "JsonTooLargeError",
    "JsonUnencodableError",
    "LeaseError",
    "LeaseExpiredError",
    "LeaseHeldError",
    "LeaseLostError",
    "MemoryStore",
    "NewEvent",
    "NotAnEmelexDatabaseError",
    "ReplayPage",
    "ReplayRequiredError",
    "ReservedEventKindError",
    "SchemaTooNewError",
    "Session",
    "SessionLease",
    "SessionNotFoundError",
    "SessionPage",
    "Settings",
    "StaleCursorError",
    "StoreError",
    "StoreExistsError",
    "WorkspaceError",
    "WorkspaceIdentity",
    "WorkspaceMissingError",
    "WorkspaceReplacedError",
]
