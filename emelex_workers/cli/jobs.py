"""`emelex memory jobs list|failed|retry|cancel|rescue` and `emelex memory compact SESSION`.

These commands only inspect and steer the durable work queues; they never run
inference. `emelex memory compact` plans and queues compaction, and a worker
(`emelex memory work`, or the library's `run_one_job`) performs it later. It
plans for the installed default model, bound through the plugins exactly as
the worker binds it (its context window, capped by `model_max_context_tokens`,
and its tokenizer); `--context-window N` plans for another window instead, with
the tokenizer-free estimate of one token per 4 bytes and no model at all.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Optional

import typer

from emelex_memory import CompactionPolicy, Job, JobPage, MemoryStore, TurnTooLargeError, describe_producer
from emelex_memory.compaction.planning import tokens_text
from emelex_memory.queue.jobs import STATES

from ..worker.attempts import attempt_text, diagnostic_attempt, job_attempt
from ..worker.planning import default_model_budget
from ..worker.work_report import done_detail
from .common import (
    CursorOpt,
    EmelexTyper,
    JsonFlag,
    SessionArg,
    echo_json,
    echo_page,
    read_listing,
    known_kind,
    one_of,
    open_store,
    page_limit,
    settings_of,
    share,
    usage_error,
    when,
)
from .work_display import cost_text

jobs_app = EmelexTyper(help="Inspect and steer the compaction and distillation work queues.")

JobArg = Annotated[str, typer.Argument(
    metavar="JOB", help="Job ID, or a unique prefix of it (at least 4 characters).", show_default=False,
)]
LimitOpt = Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Jobs per page.")]


def job_dict(job: Job) -> dict:
    """A job as plain JSON-ready data."""
    return asdict(job)


def cost_of(job: Job) -> tuple[str, dict | None]:
    """What the job's last attempt cost and how it is labelled: a done job's result "cost", else the newest
    diagnostic that recorded one ("attempt N of M cost"); ("", None) when none did."""
    if job.result and isinstance(job.result.get("cost"), dict):
        return "cost", job.result["cost"]
    for diagnostic in reversed(job.diagnostics):
        if diagnostic.cost:
            return f"{attempt_text(diagnostic_attempt(diagnostic.event, diagnostic.attempts))} cost", diagnostic.cost
    return "", None


def _line(job: Job) -> str:
    due = f" due {when(job.due_at)}" if job.state == "pending" else ""
    held = f" by {job.lease_holder} until {when(job.lease_expires_at)}" if job.state == "claimed" else ""
    label, cost = cost_of(job)
    spent = f"  {label}: {cost_text(cost)}, {cost.get('seconds', 0):.1f}s" if cost else ""
    said = done_detail(job.result) if job.state == "done" else "completed"
    outcome = "" if said == "completed" else f"  {said}"
    tokens = job.source.get("source_tokens") if isinstance(job.source, dict) else None
    size = f"  source {tokens_text(tokens, job.source.get('tokens_estimated') is True)}" if (
        isinstance(tokens, int) and not isinstance(tokens, bool)) else ""
    producer = job.result.get("producer") if isinstance(job.result, dict) else None
    by = f"  by {describe_producer(producer)}" if isinstance(producer, dict) else ""
    return (f"{job.id}  {job.kind:<12} {job.state:<9} {attempt_text(job_attempt(job))}{due}{held}  Session {job.session_id}"
            f"{size}{by}{spent}{outcome}")


def _line_with_diagnostics(job: Job) -> str:
    diagnostics = [f"    {when(d.at)}  {d.event:<9} {attempt_text(diagnostic_attempt(d.event, d.attempts))}  {d.message}"
                   for d in job.diagnostics]
    return "\n".join([_line(job), *diagnostics])


@jobs_app.command("list")
def jobs_list(
    ctx: typer.Context,
    state: Annotated[Optional[str], typer.Option(
        metavar="STATE", callback=one_of(*STATES), help="pending, claimed, done, failed or cancelled.")] = None,
    kind: Annotated[Optional[str], typer.Option(
        metavar="KIND", callback=known_kind, help="Only jobs of this kind, e.g. compaction.")] = None,
    session: Annotated[Optional[str], typer.Option(
        metavar="SESSION", help="Only jobs of this Session (ID or unique prefix).")] = None,
    limit: LimitOpt = 50,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List jobs, newest first (none on a Home without a store yet)."""
    def read(store: MemoryStore) -> JobPage:
        of = None if session is None else store.resolve_session_id(session)
        return store.list_jobs(state=state, kind=kind, session_id=of, cursor=cursor, limit=limit)

    page = read_listing(ctx, read, JobPage([], None))
    echo_page("jobs", page.jobs, page.next_cursor, as_json, as_dict=job_dict, line=_line, empty="no jobs")


@jobs_app.command("failed")
def jobs_failed(
    ctx: typer.Context,
    kind: Annotated[Optional[str], typer.Option(metavar="KIND", help="Only jobs of this kind.")] = None,
    limit: LimitOpt = 20,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List terminal jobs (failed, or cancelled) with their diagnostics, newest first (none on a Home without a
    store yet)."""
    page = read_listing(ctx, lambda store: store.failed_jobs(kind=kind, cursor=cursor, limit=limit), JobPage([], None))
    echo_page(
        "jobs", page.jobs, page.next_cursor, as_json,
        as_dict=job_dict, line=_line_with_diagnostics, empty="no failed jobs",
    )


@jobs_app.command("retry")
def jobs_retry(ctx: typer.Context, job: JobArg, as_json: JsonFlag = False) -> None:
    """Reset a failed or cancelled job to pending (same ID and source, failed attempts cleared)."""
    with open_store(ctx) as store:
        done = store.retry_failed_job(store.resolve_job_id(job))
    if as_json:
        echo_json("retried", job_dict(done))
    else:
        typer.echo(f"job {done.id} is pending again; a worker will run it")


@jobs_app.command("cancel")
def jobs_cancel(ctx: typer.Context, job: JobArg, as_json: JsonFlag = False) -> None:
    """Cancel a pending or claimed job without consuming an attempt; `jobs retry` brings it back."""
    with open_store(ctx) as store:
        done = store.cancel_job(store.resolve_job_id(job))
    if as_json:
        echo_json("cancelled", job_dict(done))
    else:
        typer.echo(f"job {done.id} cancelled")


@jobs_app.command("rescue")
def jobs_rescue(ctx: typer.Context, job: JobArg, as_json: JsonFlag = False) -> None:
    """Free a job whose worker died on this host, without waiting for its lease to expire.

    Only when the job is claimed by a worker on this host whose process no
    longer exists; recorded as the automatic rescue after expiry records it:
    one counted failure, retried by the schedule. `emelex memory work` names
    such jobs and this command.
    """
    with open_store(ctx) as store:
        done = store.rescue_dead_claim(store.resolve_job_id(job))
    if as_json:
        echo_json("rescued", job_dict(done))
    elif done.state == "failed":
        typer.echo(f"job {done.id} rescued; that was {attempt_text(done.attempts)}, the last: it failed "
                   f"(`emelex memory jobs retry {done.id}` runs it again)")
    else:
        typer.echo(f"job {done.id} rescued from its dead worker; pending again: {attempt_text(job_attempt(done))} due "
                   f"{when(done.due_at)}")


def _too_large_advice(exc: TurnTooLargeError, window_given: bool, settings) -> TurnTooLargeError:
    """`exc` with a remedy for `compact`: the flag or settings to change, and the window that would fit the turn."""
    fits = exc.min_context_window
    model = (f"the worker's model needs a window of {fits} tokens or more (`emelex models install PATH`, then set "
             f"default_model) and model_max_context_tokens (now {settings.model_max_context_tokens}) at least {fits}")
    if window_given:
        remedy = f"re-run with `--context-window {fits}` or more; for the job to run, {model}"
    else:
        remedy = f"{model}; then run `emelex memory compact` again"
    return TurnTooLargeError(f"{exc.problem}: {remedy}", problem=exc.problem, min_context_window=fits)


def compact(
    ctx: typer.Context,
    session: SessionArg,
    context_window: Annotated[Optional[int], typer.Option(
        metavar="TOKENS", min=1,
        help="Plan for this window (tokens), estimating 4 bytes per token, instead of the default model's.",
    )] = None,
    trigger_ratio: Annotated[float, typer.Option(
        metavar="SHARE", callback=share, help="Compact once the view uses this share of the window.",
    )] = CompactionPolicy.trigger_ratio,
    target_ratio: Annotated[float, typer.Option(
        metavar="SHARE", callback=share, help="Shrink the uncompacted tail to this share of the window.",
    )] = CompactionPolicy.target_ratio,
    preserve_turns: Annotated[int, typer.Option(metavar="N", min=0, help="Newest turns always kept.")] = (
        CompactionPolicy.preserve_turns),
    force: Annotated[bool, typer.Option("--force", help="Compact below the trigger (all but the kept turns).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Plan compaction of a Session and queue it; print what was queued or why nothing was.

    Plans for the installed default model (loaded for its tokenizer and
    context window; no inference) unless --context-window is given. A
    Session too long for one job is compacted in steps, each fitting the
    model. Nothing runs here: `emelex memory work` performs the job once no
    one holds the Session; `emelex memory compaction revert` undoes it.
    """
    if target_ratio > trigger_ratio:
        raise usage_error(ctx, f"--target-ratio ({target_ratio}) must not exceed --trigger-ratio ({trigger_ratio})")
    policy = CompactionPolicy(trigger_ratio=trigger_ratio, target_ratio=target_ratio, preserve_turns=preserve_turns)
    settings = settings_of(ctx)
    model = None
    with MemoryStore.open(settings, create=False) as store:
        session = store.resolve_session_id(session)  # an unknown Session fails before the model is loaded
        try:
            if context_window is not None:
                queued = store.queue_compaction(session, context_window=context_window, policy=policy, force=force)
            else:
                with default_model_budget(settings) as budget:
                    model = budget.model.reference
                    queued = store.queue_compaction(session, context_window=budget.context_window,
                                                    count_tokens=budget.count_tokens, policy=policy, force=force)
        except TurnTooLargeError as exc:
            raise _too_large_advice(exc, context_window is not None, settings) from None
    ended = _ended(queued)
    if as_json:
        outcome = "queued" if queued.created else ended or ("already-queued" if queued.job else "not-needed")
        echo_json(outcome, {"plan": asdict(queued.plan), "job": queued.job and job_dict(queued.job),
                            "created": queued.created, "reason": queued.reason, "model": model})
    else:
        planned = f"{model}, {queued.plan.context_window}-token window" if model else (
            f"{queued.plan.context_window}-token window, estimated tokens")
        typer.echo(f"{'nothing queued: ' if ended else ''}{queued.reason} [planned for {planned}]")
    if ended:
        raise typer.Exit(1)


def _ended(queued) -> str | None:
    """How the earlier job of exactly this plan ended, when that is why nothing was queued ("failed",
    "cancelled", or "reverted" for a done job whose Summary was reverted); None otherwise."""
    job = queued.job
    if queued.created or job is None or job.state in ("pending", "claimed"):
        return None
    return "reverted" if job.state == "done" else job.state
