"""The demo behind `make demo`: seed a real store under EMELEX_HOME, then drive the `emelex` CLI over it."""

from __future__ import annotations

import sys
from pathlib import Path

from emelex_memory import MemoryStore, NewEvent, Settings

from .cli import app

CONVERSATION = [
    ("How do I run the tests here?", "Run `make test`; it creates .venv and runs pytest."),
    ("Where does the database live?", "Under Emelex Home, in memory/emelex.sqlite3, mode 0600."),
    ("What happens if I delete it?", "Emelex refuses to recreate it silently; `emelex memory reinit --yes` starts over."),
    ("Can two agents write one Session?", "No: one live SessionLease per Session; the second gets LeaseHeldError."),
]


def seed(workspace: Path, settings: Settings) -> str:
    """Create one Session in `workspace` holding the demo conversation; return its ID."""
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace, title="Demo: getting to know Emelex")
        with store.acquire_lease(session.id, workspace) as lease:
            lease.replay()
            for question, answer in CONVERSATION:
                lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})])
            lease.release()
    return session.id


def _run(*args: str) -> None:
    print(f"\n$ emelex {' '.join(args)}", flush=True)
    try:
        app(list(args), standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise


def main(argv: list[str]) -> None:
    """`python -m emelex_workers.demo WORKSPACE`: seed, then list, show and check the store."""
    workspace = Path(argv[0] if argv else ".").resolve()
    session_id = seed(workspace, Settings())
    _run("memory", "sessions", "list")
    _run("memory", "sessions", "show", session_id)
    _run("memory", "doctor")


if __name__ == "__main__":
    main(sys.argv[1:])
