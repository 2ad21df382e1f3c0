"""The worker behind `emelex memory work`: a thin loop over the library's `run_one_job` that runs plugins.

One run: rescue expired claims; if anything is pending, resolve the installed
model, the summarizer and the distiller (configuration errors stop here,
before any claim); then claim due jobs one at a time (Sessions with a live
lease are skipped by the claim itself), bind the model to the job's Session
(snapshot lock held through that commit), run the plugin, and record the
outcome with the queue's retry rules. It stops when the queue has no due job,
after `max_jobs` jobs, once `max_seconds` have passed, or on a stop request
(SIGINT/SIGTERM through `GracefulStop`): the job in hand is released to
pending without consuming an attempt, or finishes if it was already
committing.

Every job has a deadline (`job_max_seconds`, or the summarizer's or distiller's
own `max_seconds`), and the run's `max_seconds` ends the job in hand too
(`GracefulStop.deadline`). A job stopped at its own deadline is a counted,
retryable failure (the third is terminal); one stopped because the run's time
ran out is released uncounted, unless it was the run's first job and so had
the whole run to itself, which counts as a failed attempt: a plugin that always
hangs becomes `failed` whichever bound stops it. A summarizer or distiller
declared `needs_model=False` runs without an installed model (`EstimatedBinding`).
What each job's output must be is checked in `outputs.py`; the Summary and the
Knowledge versions it writes record the plugin that produced them
(`producer`). The model is bound through the plugins once per run and loaded
lazily, on the first job that needs it. A model or plugin problem met while
binding or loading it (`ModelError`, `PluginError`: a tampered or removed
model, a lock timeout, a failed binding or load) is not the job's fault: the
job is released without consuming an attempt and the run stops by raising
that error; so is a `ModelError` raised while the job runs the model (a
served model's server unreachable, timed out or failing mid-reply). Several workers may run at once.

What it shows: an observer (`WorkObserver`) hears when a job starts (kind,
job, Session, source size in tokens), how the model's generation progresses
(through the binding's `on_token`, see `metering.py`) and how the job ended.
Each attempt's cost (prompt and generated tokens, model calls, seconds) is
recorded with the job: in its result when it completes, in the diagnostic
of a failed or released attempt. At the end, the report lists the jobs left
waiting and why (`MemoryStore.waiting_jobs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from emelex_memory import (
    COMPACTION_KIND,
    DISTILL_KIND,
    EmelexError,
    InvalidInputError,
    MemoryStore,
    ModelError,
    PluginError,
    PluginHookError,
    WorkerLeaseLostError,
)

from ..settings import WorkerSettings
from .stopping import GracefulStop, JobDeadline, WorkerStopped
from .work_report import JobReport, JobStart, WorkObserver, WorkReport, done_detail

if TYPE_CHECKING:  # the runner, the plugin and model layers are imported once there is work (an idle run loads none)
    from emelex_memory import InstalledModel, Job, JobClaim, JobOutcome, SummaryDraft

    from .metering import MeteredBinding
    from ..host.manager import EmelexPluginManager, Registered

KINDS = (COMPACTION_KIND, DISTILL_KIND)
NO_MODEL = "(no model)"  # the binding plugin named for a model-free summarizer's or distiller's estimate
REPORTED_WAITING = 20  # waiting jobs a report lists (it counts them all)
BYTES_PER_TOKEN = 4  # the estimate for a source whose tokens were not counted when it was queued


class RunOutOfTime(BaseException):  # noqa: N818 - a control-flow signal, like WorkerStopped
    """Raised inside a running job when the run's `max_seconds` ran out: the job was released without consuming an
    attempt (`where` says what it was doing), then the run ends."""

    def __init__(self, where: str = "") -> None:
        """The run's time ran out, met `where`."""
        super().__init__(where)
        self.where = where


class ModelUnavailable(BaseException):  # noqa: N818 - a control-flow signal carrying the real error
    """Raised inside a running job when binding or loading the model failed with `error` (a `ModelError` or
    `PluginError`): the job is released without consuming an attempt, then the run stops by raising `error`."""

    def __init__(self, error: EmelexError) -> None:
        """Carry `error`, the model or plugin problem that stops the run."""
        super().__init__(str(error))
        self.error = error


class Worker:
    """Runs due jobs of `kinds` (default: compaction and distillation) from `store` through plugins.

    `pm` defaults to `get_plugin_manager(settings)` and `model` to the
    installed `default_model`, both resolved only when there is work.
    `observer` (a `WorkObserver`) hears each job start, progress and end;
    `on_job(report)` is also called after each job.
    """

    def __init__(
        self,
        store: MemoryStore,
        settings: WorkerSettings,
        *,
        kinds: tuple[str, ...] = KINDS,
        pm: EmelexPluginManager | None = None,
        model: InstalledModel | None = None,
        stop: GracefulStop | None = None,
        observer: WorkObserver | None = None,
        on_job: Callable[[JobReport], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Prepare a run; nothing is loaded yet."""
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise InvalidInputError(f"the worker runs {', '.join(KINDS)} jobs, not {', '.join(unknown) or 'none'}")
        self.store, self.settings, self.kinds = store, settings, tuple(kinds)
        self.stop = stop or GracefulStop()
        self._pm, self._model, self._on_job, self._clock = pm, model, on_job, clock
        self._observer = observer
        self._binding: MeteredBinding | None = None
        self._binding_plugin = ""
        self._window = 0
        self._summarizer: Registered | None = None
        self._distiller: Registered | None = None
        self._claim: JobClaim | None = None  # the job in hand, and when its step began (`_step`)
        self._held: list[JobClaim] = []  # the next job, claimed by the last completion
        self._began = 0.0
        self._estimate: MeteredBinding | None = None  # the model-free components' binding (`EstimatedBinding`)
        self._run_end: float | None = None  # when the run's `max_seconds` runs out (the worker's clock)
        self._first_job: str | None = None  # the ID of the run's first job (it had the whole run)

    # -- set-up, only when there is work -------------------------------------------------------------

    def prepare(self) -> None:
        """Resolve the plugins, the model, the summarizer and the distiller this run needs (no model load)."""
        from ..models import ModelManager
        from ..host.manager import choose, distillers, get_plugin_manager, summarizers

        if self._pm is None:
            self._pm = get_plugin_manager(self.settings)
        if COMPACTION_KIND in self.kinds and self._summarizer is None:
            self._summarizer = choose(summarizers(self._pm), self.settings.summarizer, "summarizer")
        if DISTILL_KIND in self.kinds and self._distiller is None:
            self._distiller = choose(distillers(self._pm), self.settings.distiller, "distiller")
        needs_model = any(r.component.needs_model for r in (self._summarizer, self._distiller) if r is not None)
        if self._model is None and needs_model:  # a model-free summarizer and distiller run without one
            with ModelManager(self.settings) as manager:
                self._model = manager.default()

    def _component(self, job: Job) -> Registered:
        """The summarizer or distiller that runs `job`."""
        return self._summarizer if job.kind == COMPACTION_KIND else self._distiller

    def _bound(self, claim: JobClaim) -> InstalledModel | None:
        """Bind the model to the job's Session, then (once per run) through the plugins, and load it; for a
        model-free summarizer or distiller, the estimate instead (None: no model)."""
        from .metering import MeteredBinding
        from .outputs import EstimatedBinding
        from .planning import context_window
        from ..host.manager import bind_model

        self.prepare()
        if not self._component(claim.job).component.needs_model:
            if self._estimate is None:
                window = self.settings.model_max_context_tokens
                self._estimate = MeteredBinding(EstimatedBinding(window, self._named(claim.job)), self.stop)
            return None
        bound = self.store.bind_session_model(claim.job.session_id, self._model)
        if self._binding is None:
            self._binding_plugin, binding = bind_model(self._pm, bound.model, self.settings, stop=self.stop.event)
            self._binding = MeteredBinding(binding, self.stop)
            self._window = 0
        if not self._window:
            self._window = context_window(self._binding, self._binding_plugin, self.settings)
        return bound.model

    def close(self) -> None:
        """Free the model binding, if one was made; a binding that fails to close is a `PluginHookError` naming its
        plugin."""
        if self._binding is not None:
            from .planning import binding_call

            try:
                binding_call(self._binding_plugin, "close the model", self._binding.close)
            finally:
                self._binding = None

    def job_in_hand(self) -> str | None:
        """The ID of the job this run holds right now (running, or claimed next), or None."""
        for claim in (self._claim, *self._held):
            if claim is not None and not claim.ended:
                return claim.id
        return None

    def release_at_once(self, reason: str) -> str:
        """For a second stop request, in its signal handler: give the job in hand (and a next one a completion
        claimed) back to pending through a zero-wait connection (`JobClaim.close`), never blocking; return what
        was done, one clause ("" when no job was in hand)."""
        said = []
        for claim in (self._claim, *self._held):
            if claim is None or claim.ended:
                continue
            if claim.close(reason):
                said.append(f"job {claim.id} released")
            else:
                said.append(f"job {claim.id} left to its worker lease (the database was busy); the next run "
                            "counts it as a failed attempt")
        return "; ".join(said)

    # -- one job ---------------------------------------------------------------------------------------

    def _handle(self, claim: JobClaim) -> Any:
        """The handler `run_one_job` calls with each claim: bind the model, run the job (`_compact` or `_distill`), and
        return what completes it; the attempt's cost is recorded with the claim first. A stop request or a model
        that is unavailable releases the job without consuming an attempt."""
        self._claim = claim
        self._first_job = self._first_job or claim.id
        start = self._start(claim.job)
        self._notify("job_started", start)
        try:
            self.stop.check("before the job started")
            try:
                with self.stop.deferred():  # the snapshot lock and the Session's binding: a stop waits for them
                    model = self._bound(claim)
            except (ModelError, PluginError) as exc:
                self.stop.check("while loading the model")
                raise ModelUnavailable(exc) from None
            self.stop.check("once the model was loaded")
            binding, plugin, window = self._job_binding(model)
            cost = binding.begin_job(partial(self._notify, "generating", start))
            seconds, reason = self._deadline_of(claim.job)
            try:
                with self.stop.deadline(seconds, reason):
                    try:
                        if claim.job.kind == COMPACTION_KIND:
                            result = self._compact(claim, model, binding, plugin, window)
                        else:
                            result = self._distill(claim, binding, plugin, window)
                    except ModelError as exc:  # the model stopped working mid-job (a served model's server went away)
                        self.stop.check("while the model ran")
                        raise ModelUnavailable(exc) from None
                    except Exception:
                        self.stop.check("while the job ran")  # a failure met while stopping is the stop's, not the job's
                        raise
                    self.stop.check("before its result was committed")  # a plugin that swallowed its deadline
            except JobDeadline as met:
                raise self._past_deadline(claim, met, seconds) from None
            finally:  # before run_one_job records the outcome, which stores the cost with it
                claim.record_cost(cost.as_dict(self._clock() - self._began))
            self.stop.check("before its result was committed")
            return result
        except RunOutOfTime as ended:
            _release(claim, f"the run's max_seconds ran out{ended.where}; no attempt consumed")
            raise
        except WorkerStopped as stopped:
            where = f" {stopped.where}" if stopped.where else ""
            _release(claim, f"worker stopped by {stopped.signal_name}{where}; no attempt consumed")
            raise
        except ModelUnavailable as unavailable:
            from emelex_memory.queue.runner import describe

            _release(claim, f"model unavailable, no attempt consumed: {describe(unavailable.error)}")
            raise

    def _compact(self, claim: JobClaim, model: InstalledModel | None, binding: MeteredBinding, plugin: str,
                 window: int) -> SummaryDraft:
        """A compaction job, top to bottom: read its source (one read transaction), check it fits the model, have the
        summarizer write the Summary, check its text and budget, guard it against the source, and return the draft
        its completion commits (with the next step of a compaction in steps) and the plugin that wrote it."""
        from emelex_memory import check_source_fits

        from ..host.types import SummaryRequest
        from .outputs import checked_summary
        from .planning import count_text, event_counter

        job = claim.job
        count = event_counter(binding, plugin)
        events = self.store.read_compaction_source(job)
        check_source_fits(job, events, context_window=window, count_tokens=count)
        budget = int(job.source["summary_budget_tokens"])
        component = self._summarizer.component
        request = SummaryRequest(job, tuple(events), budget, binding, job.attempts, self.settings)
        calls = binding.cost.model_calls
        text = self._plugin_call(self._summarizer, component.summarize, request)
        called = binding.cost.model_calls > calls  # a rule-based summarizer's Summary names no model
        text, cuts = checked_summary(text, named=self._named(job), budget=budget,
                               count=lambda t: count_text(binding, plugin, t), job=job, events=events,
                               examples=component.examples, model_called=called)
        return self.store.compaction_draft(job, text, model.reference if called and model else None,
                                           context_window=window, count_tokens=count,
                                           producer=self._producer(self._summarizer), cuts=cuts)

    def _distill(self, claim: JobClaim, binding: MeteredBinding, plugin: str, window: int) -> Any:
        """A distill job, top to bottom: read its bounded source and the workspace's Knowledge (or split a source too
        large for the model), have the distiller propose candidates, guard them against the source, and return
        what its completion applies, naming the plugin that proposed them."""
        from dataclasses import replace

        from emelex_memory import DistillationSplit, distillation_input
        from emelex_memory.knowledge.distillation import DISTILL_RESERVE_TOKENS, MAX_CANDIDATES

        from ..host.types import DistillRequest
        from .outputs import checked_candidates, read_proposals
        from .planning import event_counter

        job = claim.job
        count = event_counter(binding, plugin)
        data = distillation_input(self.store, job, safe_context_tokens=window - DISTILL_RESERVE_TOKENS,
                                  count_tokens=count)
        if isinstance(data, DistillationSplit):
            return data
        distiller = self._distiller.component
        request = DistillRequest(job, data, MAX_CANDIDATES, binding, job.attempts, self.settings)
        proposals = self._plugin_call(self._distiller, lambda r: read_proposals(distiller.distill(r)), request)
        result = checked_candidates(proposals, events=data.events, examples=distiller.examples)
        return replace(result, producer=self._producer(self._distiller))

    # -- the plugin of a job: its binding, its deadline, its name and provenance -----------------------------

    def _job_binding(self, model: InstalledModel | None) -> tuple[MeteredBinding, str, int]:
        """The binding a job's plugin gets, the plugin that made it and its window: the model's, or the estimate of a
        model-free summarizer or distiller (`model` None)."""
        if model is None:
            return self._estimate, NO_MODEL, self._estimate.context_window
        return self._binding, self._binding_plugin, self._window

    def _deadline_of(self, job: Job) -> tuple[float, str]:
        """How long `job` may run and which bound that is: "job" (its component's `max_seconds`, else the
        `job_max_seconds` setting) or "run" (what is left of the run's `max_seconds`, when that is sooner)."""
        own = self._component(job).component.max_seconds
        seconds = float(own) if own else self.settings.job_max_seconds
        if self._run_end is not None and self._run_end - self._clock() < seconds:
            return max(self._run_end - self._clock(), 0.0), "run"
        return seconds, "job"

    def _past_deadline(self, claim: JobClaim, met: JobDeadline, seconds: float) -> BaseException:
        """What a job stopped at a deadline becomes: a counted failure naming the plugin when it was the job's own
        deadline, or when the run's time ran out in the run's first job (it had the whole run); otherwise
        `RunOutOfTime` (released uncounted)."""
        where = f" {met.where}" if met.where else ""
        named = self._named(claim.job)
        if met.reason == "job":
            own = self._component(claim.job).component.max_seconds
            bound = "its own max_seconds" if own else "the job_max_seconds setting"
            return PluginHookError(f"{named} did not finish within the job's deadline of {seconds:g} s ({bound}); "
                                   f"it was stopped{where}; a retry gets the same time: raise job_max_seconds if the "
                                   "job needs longer, or fix the plugin if it hangs")
        if claim.id != self._first_job:
            return RunOutOfTime(where)
        return PluginHookError(f"{named} did not finish before the run's max_seconds ran out, though it was the run's "
                               f"first job; it was stopped{where}; raise --max-seconds (work_max_seconds) if the "
                               "job needs longer, or fix the plugin if it hangs")

    def _named(self, job: Job) -> str:
        """How a diagnostic names `job`'s summarizer or distiller: `summarizer 'x' of plugin 'y'`."""
        from .outputs import component_name

        registered = self._component(job)
        return component_name(type(registered.component).__name__.lower(), registered.component.name,
                              registered.plugin)

    def _producer(self, registered: Registered) -> dict[str, str]:
        """The provenance of what `registered` writes: its plugin, that plugin's distribution and version, its kind,
        name and mode."""
        info = self._pm.plugin_info.get(registered.plugin) if self._pm is not None else None
        found = {"plugin": registered.plugin, "kind": type(registered.component).__name__.lower(),
                 "name": registered.component.name, "mode": registered.component.mode,
                 "distribution": info.distribution if info else "", "version": info.version if info else ""}
        return {k: v[:200] for k, v in found.items() if isinstance(v, str) and v}

    def _plugin_call(self, registered: Registered, call: Callable[[Any], Any], request: Any) -> Any:
        """`call(request)`, a plugin's summarizer or distiller, through `plugin_call`, naming the component and its
        plugin, traced when plugins are (`plugins_trace`); a stop requested or a deadline passed while its own code
        runs (not a model call: see `MeteredBinding`) raises there."""
        from ..host.manager import plugin_call, traced

        kind = type(registered.component).__name__.lower()
        named = f"{kind} {registered.component.name!r} of plugin {registered.plugin!r}"
        arguments = {"request": request}
        with self.stop.interruptible(f"while the {kind} ran"):
            return traced(self._pm, f"{kind} {registered.component.name!r}", registered.plugin, arguments,
                          lambda: plugin_call(lambda: call(request), f"{named} failed"))

    # -- the run -------------------------------------------------------------------------------------------

    def run(self, *, max_jobs: int | None = None, max_seconds: float | None = None) -> WorkReport:
        """Work until the queue has no due job, `max_jobs` (default `work_max_jobs`) were claimed, `max_seconds`
        (default `work_max_seconds`) passed, or a stop was requested; return what happened.

        Raises the `ModelError` or `PluginError` that stopped the run: before
        any claim (no model installed, unknown summarizer, broken plugin), or
        while binding or loading the model for a job, which is then released
        without consuming an attempt."""
        max_jobs = self.settings.work_max_jobs if max_jobs is None else max_jobs
        max_seconds = self.settings.work_max_seconds if max_seconds is None else max_seconds
        start, report = self._clock(), WorkReport()
        self._run_end, self._first_job = start + max_seconds, None
        report.rescued = self.store.rescue_expired_jobs()
        if self._has_pending():
            self.prepare()
            # Asked as a job completes: will the run go on after it? Then the completion claims the next job too.
            goes_on = partial(self._limit_reached, report, start, max_jobs - 1, max_seconds)
            held = self._held = []  # the next job, claimed by the last completion
            try:
                while True:
                    report.stopped = self._limit_reached(report, start, max_jobs, max_seconds)
                    if report.stopped:
                        break
                    if not self._step(report, held, lambda: not goes_on()):
                        report.stopped = report.stopped or "empty"
                        break
            finally:
                if held:  # a stop requested after the completion that claimed it: give it back, uncounted
                    _release(held.pop(), f"the worker stopped ({report.stopped or 'error'}) before starting the job; "
                             "no attempt consumed")
        report.stopped = report.stopped or "empty"
        if self.settings.embedder is not None and not self.stop.requested:
            report.embedded = self._embed()
        report.waiting = self.store.waiting_jobs(kinds=self.kinds, limit=REPORTED_WAITING)
        report.seconds = self._clock() - start
        return report

    def _embed(self) -> int:
        """The embedding pass after the jobs (`embedding.py`): vectors of what the index holds, until a stop."""
        from ..host.manager import get_plugin_manager
        from .embedding import embed_pending, embedder_of

        if self._pm is None:
            self._pm = get_plugin_manager(self.settings)
        embedder = embedder_of(self.settings, self._pm)
        try:
            return embed_pending(self.store, embedder, stop=lambda: bool(self.stop.requested))
        finally:
            if embedder.close is not None:
                embedder.close()

    def _has_pending(self) -> bool:
        return any(self.store.list_jobs(state="pending", kind=k, limit=1, max_bytes=64 * 1024).jobs for k in self.kinds)

    def _limit_reached(self, report: WorkReport, start: float, max_jobs: int, max_seconds: float) -> str:
        if self.stop.requested:
            return f"signal:{self.stop.requested}"
        if report.claimed >= max_jobs:
            return "max-jobs"
        if self._clock() - start >= max_seconds:
            return "max-seconds"
        return ""

    def _step(self, report: WorkReport, held: list[JobClaim], go_on: Callable[[], bool]) -> bool:
        """Run one job: the one in `held` (taken from it), else a new claim; a completion after which `go_on()` says
        True claims the next job in its transaction and leaves it in `held`."""
        from emelex_memory import run_one_job
        from emelex_memory.queue.runner import describe

        self._began, self._claim = self._clock(), None
        try:
            outcome: JobOutcome | None = run_one_job(
                self.store, self._handle, kinds=self.kinds, claim=held.pop() if held else None, claim_next=go_on
            )
        except WorkerStopped as stopped:
            report.stopped = f"signal:{stopped.signal_name}"
            where = f" {stopped.where}" if stopped.where else ""
            self._record(report, self._claim.job, "released", f"stopped by {stopped.signal_name}{where}")
            return False
        except RunOutOfTime as ended:
            report.stopped = "max-seconds"
            self._record(report, self._claim.job, "released", f"stopped: the run's max_seconds ran out{ended.where}")
            return False
        except ModelUnavailable as unavailable:
            report.stopped = "error"
            self._record(report, self._claim.job, "released", describe(unavailable.error))
            raise unavailable.error from None
        if outcome is None:
            return False
        if outcome.next_claim is not None:
            held.append(outcome.next_claim)
        job = outcome.job
        self._record(report, job, outcome.status, done_detail(job.result) if outcome.status == "done" else outcome.detail)
        return True

    def _start(self, job: Job) -> JobStart:
        """The job as it starts, with its source's size: the tokens counted when it was queued (compaction; an
        estimate when its source says so), or else an estimate from the stored bytes of its events."""
        tokens = job.source.get("source_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool):
            return JobStart(job.id, job.kind, job.session_id, job.attempts + 1, tokens,
                            job.source.get("tokens_estimated") is True, self._needs_model(job))
        size = self.store.job_source_bytes(job)
        estimate = None if size is None else -(-size // BYTES_PER_TOKEN)
        return JobStart(job.id, job.kind, job.session_id, job.attempts + 1, estimate, estimate is not None,
                        self._needs_model(job))

    def _needs_model(self, job: Job) -> bool:
        """Whether the summarizer or distiller that runs `job` calls the model."""
        return self._component(job).component.needs_model

    def _notify(self, event: str, *args: Any) -> None:
        """Tell the observer about `event`; an observer that raises is dropped, so a display never fails a job."""
        if self._observer is None:
            return
        try:
            getattr(self._observer, event)(*args)
        except Exception:
            self._observer = None

    def _record(self, report: WorkReport, job: Job, status: str, detail: str) -> None:
        """Add how `job` ended to the report (with the cost its claim recorded) and tell the observer and `on_job`."""
        cost = self._claim.cost if self._claim is not None else None
        done = JobReport(job.id, job.kind, job.session_id, status, detail, self._clock() - self._began, cost)
        report.add(done)
        self._notify("job_finished", done)
        if self._on_job is not None:
            self._on_job(done)


def _release(claim: JobClaim, reason: str) -> None:
    """Give the job back to pending without consuming an attempt (nothing to do if the lease is already gone)."""
    try:
        claim.release(reason)
    except WorkerLeaseLostError:
        pass


def work(store: MemoryStore, settings: WorkerSettings, **options: Any) -> WorkReport:
    """Convenience: one `Worker(store, settings, **options).run()`, closing the model binding afterwards."""
    run_options = {k: options.pop(k) for k in ("max_jobs", "max_seconds") if k in options}
    worker = Worker(store, settings, **options)
    try:
        return worker.run(**run_options)
    finally:
        worker.close()
