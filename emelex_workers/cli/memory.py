"""`emelex memory ...`: the command group; each subcommand's module is imported only when that subcommand runs."""

from __future__ import annotations

from .common import EmelexTyper, Lazy, LazyGroup

_CLI = "emelex_workers.cli"


class MemoryCommands(LazyGroup):
    """`emelex memory`: its commands, then its command groups, as `emelex memory --help` lists them."""

    lazy_commands = {
        "maintain": Lazy(f"{_CLI}.maintain:maintain",
                         "Fail stale leases, apply retention, prune versions, collect assets, optimize and truncate "
                         "the WAL."),
        "compact": Lazy(f"{_CLI}.jobs:compact", "Plan compaction of a Session and queue it; print what was queued or "
                        "why nothing was."),
        "work": Lazy(f"{_CLI}.work:work",
                     "Run due compaction and distillation jobs on the local model; skip Sessions in use."),
        "doctor": Lazy(f"{_CLI}.doctor:doctor",
                       "Check Home, file modes, pragmas, connection settings, schema, integrity, transcripts, payloads, "
                       "the search index and a bounded number of asset files; exit 1 when anything is wrong."),
        "backup": Lazy(f"{_CLI}.backup:backup",
                       "Write a consistent, verified copy of the store, its assets and model manifests to DEST "
                       "(incremental)."),
        "restore": Lazy(f"{_CLI}.backup:restore", "Verify the backup at SRC, then restore it into Emelex Home, which must be empty (never over a "
                        "store)."),
        "reinit": Lazy(f"{_CLI}.doctor:reinit",
                       "Start a new store where the database was deleted. Refuses while a database file exists."),
        "search": Lazy(f"{_CLI}.search:search",
                       "Search the workspace's live Knowledge and its Sessions' transcripts; print ranked hits (one "
                       "ranking, best first) with the key or Session ID prefix, date and seq that `knowledge show` and "
                       "`sessions show` take. With an embedder set (EMELEX_EMBEDDER), the query's vector is fused with "
                       "the full-text ranking."),
        "import": Lazy(f"{_CLI}.interop:import_histories",
                       "Import other agents' histories as Sessions (with their source, digest and lines), queued for "
                       "distillation; re-importing is a no-op and a grown file adds only what is new. Also reads an "
                       "Emelex export back."),
        "export": Lazy(f"{_CLI}.interop:export",
                       "Export every Session (events, Summaries and their provenance, assets) and all Knowledge "
                       "(every version, tombstones, pins) to FILE, which `emelex memory import FILE` reads back into "
                       "any Home."),
        "sessions": Lazy(f"{_CLI}.sessions:sessions_app", "List and inspect Sessions."),
        "knowledge": Lazy(f"{_CLI}.knowledge:knowledge_app", "Inspect and curate the current workspace's Knowledge."),
        "workspaces": Lazy(f"{_CLI}.workspaces:workspaces_app",
                           "List known workspaces; rebind one whose directory was replaced (e.g. re-cloned)."),
        "assets": Lazy(f"{_CLI}.assets:assets_app", "List, show and verify stored media assets."),
        "jobs": Lazy(f"{_CLI}.jobs:jobs_app", "Inspect and steer the compaction and distillation work queues."),
        "compaction": Lazy(f"{_CLI}.compaction:compaction_app",
                           "Undo and redo compactions: revert a Summary (replay shows what it replaced again), redo "
                           "it."),
    }


memory_app = EmelexTyper(cls=MemoryCommands, help="Inspect and maintain the memory store.")
