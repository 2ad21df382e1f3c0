"""`emelex memory sessions recover SESSION`: reconcile an agent turn a crash left open, never running a tool."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from emelex_memory import OpenTurn
from emelex_memory.errors import UnknownEffectsError
from emelex_memory.agent.journal import read_journal
from emelex_memory.agent.processes import status
from emelex_memory.agent.recovery import recover_session

from .common import JsonFlag, echo_json, given_path, open_store


def journal_lines(turn: OpenTurn) -> list[str]:
    """The text lines of an open agent turn, as `sessions show` and `sessions recover` print it."""
    lines = [f"  open agent turn: input at seq {turn.input_seq}, {turn.published} batch(es) published"
             + (f", round {turn.round} journaled:" if turn.round is not None else ", no batch journaled")]
    for c in turn.calls:
        started = "" if c.started_at is None else \
            f" started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(c.started_at))}"
        effect = {"planned": "never ran", "started": "UNKNOWN EFFECT (started, no result)"}.get(
            c.state, f"completed: {(c.result or {}).get('outcome')}")
        lines.append(f"    call {c.call_id}  {c.tool} {c.arguments}{started}  {effect}")
        for record in c.processes:
            seen = status(record)
            lines.append(f"      its {record.describe()}: {'RUNNING, ' if seen.running else ''}{seen.why}")
    return lines


def recover(
    ctx: typer.Context,
    session: Annotated[str, typer.Argument(metavar="SESSION", help="Session ID, or a unique prefix of it.",
                                           show_default=False)],
    accept_unknown_effects: Annotated[bool, typer.Option(
        "--accept-unknown-effects",
        help="Record started tool calls without a result as 'unknown effect' (after you checked what they did).",
    )] = False,
    stop_running: Annotated[bool, typer.Option(
        "--stop-running",
        help="First stop the processes a started call's tool left running (SIGTERM, then SIGKILL); their effect "
             "stays unknown.")] = False,
    workspace: Annotated[Path | None, typer.Option(
        "--workspace", metavar="DIR", parser=given_path,
        help="The Session's workspace directory, where it is now (default: its recorded path).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Close an agent turn a crash left open, as resume would, without running any tool: completed calls keep their
    results, calls that never started become 'not executed'. Calls that started without a result are listed and
    nothing changes (exit 1) unless --accept-unknown-effects records them as 'unknown effect'. A Session that is live
    (its chat still runs, perhaps a tool) is refused, and so is a call whose tool's process still runs (a command
    that outlived its chat) until it ends or --stop-running stops it. --workspace names a workspace that was
    renamed."""
    with open_store(ctx) as store:
        sid = store.resolve_session_id(session)
        try:
            done = recover_session(store, sid, accept_unknown_effects=accept_unknown_effects, workspace=workspace,
                                   stop_running=stop_running)
        except UnknownEffectsError as refused:
            turn = read_journal(store, sid)
            if as_json:
                echo_json("unknown_effects", {"session": sid, "journal": turn.to_json(),
                                              "stopped": _stopped_json(refused.stopped)})
            else:
                typer.echo(f"Session {sid}")
                for record, seen in refused.stopped:
                    typer.echo(f"  stopped its {record.describe()}: {seen.why}")
                for line in journal_lines(turn):
                    typer.echo(line)
            raise
    outcome = "nothing_open" if done.open_turn is None else "recovered"
    if as_json:
        echo_json(outcome, {
            "session": sid, "journal": None if done.open_turn is None else done.open_turn.to_json(),
            "results": [] if done.reconciled is None else list(done.reconciled.results),
            "stopped": _stopped_json(done.stopped),
        })
        return
    if done.open_turn is None:
        typer.echo(f"Session {sid} has no open agent turn; nothing to recover")
        return
    typer.echo(f"Session {sid}: recovered the open turn")
    for record, seen in done.stopped:
        typer.echo(f"  stopped its {record.describe()}: {seen.why}")
    processes = {c.call_id: c.processes for c in done.open_turn.calls}
    for r in done.reconciled.results:
        ended = "".join(f" (its {record.describe()}: {status(record).why})" for record in processes.get(r["call_id"], ()))
        typer.echo(f"  call {r['call_id']}  {r['tool']}: {r['outcome']}{ended}")
    typer.echo("  the turn is closed with an 'interrupted' record; resume the Session to go on")


def _stopped_json(stopped: tuple) -> list[dict]:
    """The processes `--stop-running` stopped, as JSON: each record with `running` and `why` after the stop."""
    return [{**record.to_json(), "running": seen.running, "why": seen.why} for record, seen in stopped]
