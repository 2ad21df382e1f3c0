"""`emelex memory compaction revert|redo SESSION`: undo a compaction, and do it again.

Reverting the newest Summary in effect makes replay show what it replaced
again; the Summary stays stored with its provenance, marked reverted, and redo
restores it after re-verifying it. Both are one transaction and refuse while
the Session is in use. `emelex memory sessions show SESSION --raw` shows every
Summary and what it covers.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer

from emelex_memory import CompactionReversal

from .common import EmelexTyper, JsonFlag, SessionArg, echo_json, open_store

compaction_app = EmelexTyper(
    help="Undo and redo compactions: revert a Summary (replay shows what it replaced again), redo it.",
)


def _echo(done: CompactionReversal, as_json: bool, verb: str, after: str) -> None:
    if as_json:
        echo_json(verb, dataclasses.asdict(done))
        return
    view = "shows the raw history" if done.view_summary_seq is None else f"starts from Summary #{done.view_summary_seq}"
    typer.echo(f"{verb} Summary #{done.summary_seq} of Session {done.session_id}; replay now {view}{after}")
    for job in done.cancelled_jobs:
        typer.echo(f"cancelled compaction job {job}, planned on the previous view; `emelex memory compact "
                   f"{done.session_id}` plans again")
    for job in done.requeued_jobs:
        typer.echo(f"queued compaction job {job} again, the next step of this compaction; `emelex memory work` "
                   "runs it")


@compaction_app.command("revert")
def revert(
    ctx: typer.Context,
    session: SessionArg,
    summary: Annotated[Optional[int], typer.Option(
        "--summary", metavar="SEQ", min=1, help="Seq of the Summary to revert; it must be the newest in effect (the default).",
    )] = None,
    as_json: JsonFlag = False,
) -> None:
    """Revert the newest compaction of a Session: replay shows the turns its Summary replaced again.

    The Summary stays stored with its provenance; `redo` brings it back. Refused while the Session is in use.
    """
    with open_store(ctx) as store:
        done = store.revert_compaction(store.resolve_session_id(session), summary)
    _echo(done, as_json, "reverted",
          f"; `emelex memory compaction redo {done.session_id}` brings it back")


@compaction_app.command("redo")
def redo(
    ctx: typer.Context,
    session: SessionArg,
    summary: Annotated[Optional[int], typer.Option(
        "--summary", metavar="SEQ", min=1, help="Seq of the reverted Summary to restore (default: the most recently reverted).",
    )] = None,
    as_json: JsonFlag = False,
) -> None:
    """Redo a reverted compaction of a Session, after verifying its Summary again: replay starts from it again.

    Refused while the Session is in use, or when replay no longer starts from the Summary it compacted.
    """
    with open_store(ctx) as store:
        done = store.redo_compaction(store.resolve_session_id(session), summary)
    _echo(done, as_json, "restored", "")
