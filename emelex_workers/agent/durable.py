"""`DurableAgentSession`: an in-memory `AgentSession` paired with one Session lease and the tool journal.

Every journal, transcript and lease write goes through one single-thread
executor (so journal writes stay ordered), every model round through
another, and every tool run through a third, which also stores a tool
output over its bound as an asset (`run_tool`'s `put_asset`): SQLite, fsync
and inference never run on the event loop thread. Each database step is
attempted again while another process holds the write lock past the busy
timeout, for as long as the lease is valid
(`journal.retry_busy`), so a busy store never throws a known tool result
away. A daemon thread renews the lease every TTL/3 while the adapter is
reachable, so renewal continues during inference, tool runs and approval
prompts; it holds the adapter only weakly, and an adapter dropped without
`close()` is finalized: renewal stops and the lease is released best-effort
(through a zero-wait connection, else it expires), as every lease guard is.
`close()` never releases the lease while a tool still runs: it waits for the
tool's thread to end and records the call's result first.

`turn()` arms the poison flag synchronously, before the task exists, keeps
a strong reference to the task, and only a turn that closed durably (an
answer, or a recorded failure) clears it. A cancelled or dropped turn leaves
the adapter poisoned: `turn()` refuses, `close()` releases without queueing
distillation, and the next resume reconciles the journal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import threading
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emelex_memory import MemoryStore, create_agent_session
from emelex_memory.agent import journal, processes
from emelex_memory.agent.journal import CONTEXT_KIND, REPEATED
from emelex_memory.sessions.leases import lease_ttl
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.compaction.planning import CompactionQueued
from emelex_memory.errors import (
    AgentPoisonedError,
    EmelexError,
    LeaseExpiredError,
    LeaseLostError,
    SnapshotMismatchError,
    StoreBusyError,
    TurnInProgressError,
)
from emelex_memory.sessions.leases import SessionLease
from emelex_memory.snapshots.installed import InstalledModel
from emelex_workers.host.policies import TurnPolicy, call_key
from emelex_workers.host.types import AgentBinding, GenerationInterrupted, GenerationProgress

from .context import ContextRequest, ContextSource, check_sources, gather
from .policies import policy_for
from .protocol import PROTOCOL_VERSION, PROTOCOLS, ProposedCall
from .session import AgentSession
from .tools import RegisteredTool, ToolInvocation, run_tool
from .workspace import WorkspaceWalk

Approve = Callable[[ProposedCall, RegisteredTool], "str | Awaitable[str]"]
DECISIONS = ("approve", "deny", "abort")


def build_snapshot(
    binding: AgentBinding,
    tools: Mapping[str, RegisteredTool],
    *,
    model_reference: str,
    model_snapshot_id: str,
    system_prompt: str,
    context_size: int | None = None,
    temperature: float = 0.0,
    seed: int = 42,
    round_tokens: int | None = None,
    chain_limit: int | None = None,
    calls_per_batch: int | None = None,
    context: tuple[str, ...] = (),
    protocol: str | None = None,
    policy: TurnPolicy | None = None,
) -> SessionSnapshot:
    """The snapshot of an agent over `binding` and `tools` (all of them) with these semantics; `context_size`
    defaults to the binding's context window; `context` names the context sources recorded before the first
    round (`emelex_workers.agent.context`). With a turn `policy` the snapshot records it (its name and version), its
    protocol is the policy's for this binding (`TurnPolicy.protocol`, told whether the binding calls tools natively,
    `calls_tools_natively`) unless `protocol` is given, and the round tokens, chain limit and calls per batch not
    given are the policy's. Without one nothing is recorded and the protocol (the current version by default; an
    older one of `PROTOCOLS` for a Session made with it) implies the policy, as for a Session made before policies;
    those limits then default to 512, 4 and 2. ValueError for a protocol this code does not render. A binding with
    `model_identity` (a served model) has it recorded."""
    if policy is not None and protocol is None:  # ask the binding only when the policy's protocol depends on it
        native, grammar = policy.protocol(True), policy.protocol(False)
        protocol = native if native != grammar and calls_tools_natively(binding) else grammar
    if policy is not None:
        round_tokens = policy.round_tokens if round_tokens is None else round_tokens
        chain_limit = policy.chain_limit if chain_limit is None else chain_limit
        calls_per_batch = policy.calls_per_batch if calls_per_batch is None else calls_per_batch
    protocol = protocol or PROTOCOL_VERSION
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not one of {PROTOCOLS}")
    return SessionSnapshot(
        model_reference, model_snapshot_id, protocol, binding.template_digest,
        binding.context_window if context_size is None else context_size, temperature, seed,
        512 if round_tokens is None else round_tokens, 4 if chain_limit is None else chain_limit,
        2 if calls_per_batch is None else calls_per_batch, system_prompt, tuple(t.authority() for t in tools.values()),
        getattr(binding, "model_identity", None), context, None if policy is None else policy.describe(),
    )


def calls_tools_natively(binding: AgentBinding) -> bool:
    """Whether `binding` calls tools natively: it has `stream_tool_round` and its optional `tool_calling()` says
    so (a served model's binding asks its server, once)."""
    probe = getattr(binding, "tool_calling", None)
    return callable(getattr(binding, "stream_tool_round", None)) and callable(probe) and probe().native


@dataclass(frozen=True)
class TurnResult:
    """How a turn ended: `outcome` is "answer" (with `answer`), "interrupted", "aborted" or "error" (with a bounded
    `diagnostic`); `rounds` model rounds ran and `calls` tool calls were published; `context` holds the context
    payloads recorded before this turn's first round (a Session's first turn only). `forced` says why an answer
    was forced (generated under the answer form only): "chain_limit" (the turn used its `chain_limit` tool rounds),
    "repeat" (the last round's results were all repeats) or "answered" (the turn's results hold the answer:
    `AgentSession.answered`); None for an answer the model chose."""

    outcome: str
    answer: str | None
    rounds: int
    calls: int
    diagnostic: str = ""
    context: tuple[dict, ...] = ()
    forced: str | None = None


class _Renewal(threading.Thread):
    """Renews the lease through the database executor every `interval_s` until stopped, the lease is lost, or the
    adapter is gone: it holds the adapter by a weak reference only, so an adapter dropped without `close()` can be
    collected (its finalizer, `_abandoned`, then stops this thread and releases the lease best-effort)."""

    def __init__(self, owner: DurableAgentSession, interval_s: float) -> None:
        super().__init__(name=f"renew-session-{owner.session_id}", daemon=True)
        self._owner = weakref.ref(owner)
        self._interval = interval_s
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.stopped.wait(self._interval):
            owner = self._owner()
            if owner is None:
                return
            renewed = owner._db.submit(journal.retry_busy, owner._lease, owner._lease.renew, owner._ttl)
            del owner  # never hold the adapter across a wait
            try:
                renewed.result()
            except (LeaseLostError, LeaseExpiredError) as exc:
                self.error = exc
                return
            except RuntimeError:  # the executor shut down: the adapter closed
                return
            except Exception as exc:  # a failing database: try again next interval
                self.error = exc


def _abandoned(stopped: threading.Event, lease: SessionLease, executors: tuple[ThreadPoolExecutor, ...]) -> None:
    """The finalizer of an adapter collected (or left at exit) without `close()`: stop renewing, release the lease
    best-effort (`SessionLease.close`: zero-wait, never raises; a busy store lets it expire) and stop the
    executors."""
    stopped.set()
    lease.close()
    for executor in executors:
        executor.shutdown(wait=False)


class DurableAgentSession:
    """One durable agent Session; build it with `create` or `resume`, end it with `close`."""

    def __init__(self, store: MemoryStore, lease: SessionLease, agent: AgentSession, ttl_s: float,
                 executors: tuple[ThreadPoolExecutor, ThreadPoolExecutor, ThreadPoolExecutor], *,
                 sources: Mapping[str, ContextSource], fresh: bool, context: list[dict]) -> None:
        """Internal: use `create` or `resume`."""
        self.store = store
        self._sources = dict(sources)
        self._fresh = fresh  # no event yet: the next turn records the context notes
        self._context = context
        self._lease = lease
        self.agent = agent
        self._ttl = ttl_s
        self._db, self._model, self._tools = executors
        self._stop = threading.Event()
        self._poisoned = False
        self._closed = False
        self._task: asyncio.Task | None = None
        self._tool_call: tuple[str, list] | None = None  # the running call's ID and, once it returned, its result
        self._input_seq: int | None = None  # the seq of the open turn's input (`journal.open_turn`)
        self._processes: list[tuple[str, processes.ProcessRecord]] = []  # what the running call's tool started
        self._renewal = _Renewal(self, ttl_s / 3)
        self._finalizer = weakref.finalize(self, _abandoned, self._renewal.stopped, lease, executors)
        self._renewal.start()

    # -- construction ------------------------------------------------------------------------------------

    @staticmethod
    def _executors(session: str) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor, ThreadPoolExecutor]:
        return (ThreadPoolExecutor(1, f"emelex-agent-db-{session}"), ThreadPoolExecutor(1, f"emelex-agent-model-{session}"),
                ThreadPoolExecutor(1, f"emelex-agent-tool-{session}"))

    @classmethod
    async def create(cls, store: MemoryStore, workspace: str | Path, binding: AgentBinding,
                     tools: Mapping[str, RegisteredTool], snapshot: SessionSnapshot, *, title: str | None = None,
                     ttl_s: float | None = None, model: InstalledModel | None = None,
                     new_workspace: bool = False,
                     context_sources: Mapping[str, ContextSource] | None = None,
                     policies: Mapping[str, TurnPolicy] | None = None) -> DurableAgentSession:
        """A new Session in `workspace` (`new_workspace`: as for `create_session`) with `snapshot`, the binding of
        `model` (when given, under the snapshot lock, so the model cannot be removed while the Session is retained)
        and its lease, all in one transaction (`create_agent_session`): a refused create leaves nothing. `tools`
        must provide exactly the snapshot's tool authority, `context_sources` every context source it names and
        `policies` (default: the built-in ones) the turn policy it records (`SnapshotMismatchError` otherwise); the
        first turn records their notes (`emelex_workers.agent.context`)."""
        _check_tools(snapshot, tools)
        sources = context_sources or {}
        check_sources(snapshot, sources)
        policy = policy_for(snapshot, policies)
        executors = cls._executors("new")
        ttl = lease_ttl(store.settings, ttl_s)
        create = functools.partial(create_agent_session, store, workspace, snapshot, title=title,
                                   new_workspace=new_workspace, model=model, ttl_s=ttl)
        lease = await _on(executors[0], create, shutdown=executors)
        return cls(store, lease, AgentSession(binding, snapshot, tools, exclude=_home(store), policy=policy), ttl,
                   executors, sources=sources, fresh=True, context=[])

    @classmethod
    async def resume(cls, store: MemoryStore, session_id: str, workspace: str | Path, binding: AgentBinding,
                     tools: Mapping[str, RegisteredTool], snapshot: SessionSnapshot, *,
                     ttl_s: float | None = None, model: InstalledModel | None = None,
                     context_sources: Mapping[str, ContextSource] | None = None,
                     policies: Mapping[str, TurnPolicy] | None = None) -> DurableAgentSession:
        """Resume a Session: workspace preflight, lease, verified replay, the identical snapshot (else
        `SnapshotMismatchError` naming the field; `context_sources` must provide every context source it names
        while the Session has no event yet, and are never called once it has one: its context events replay;
        `policies`, default the built-in ones, must provide the turn policy it records),
        no started call without a result (else `UnknownEffectsError`:
        recover it with `emelex memory sessions recover`), then the writes: the binding of `model` (when given) to
        the Session, the snapshot of an empty Session that has none, and the reconciliation of an interrupted turn
        without running any tool. Every refusal comes before the first write, so a refused resume releases the
        lease and changes nothing else; only an I/O failure of a later write can leave the model's binding (its
        `last_bound_at`) renewed."""
        _check_tools(snapshot, tools)
        policy = policy_for(snapshot, policies)
        executors = cls._executors(session_id[:8])
        ttl = lease_ttl(store.settings, ttl_s)

        agent = AgentSession(binding, snapshot, tools, exclude=_home(store), policy=policy)
        sources = context_sources or {}
        replayed: list = []

        def setup() -> SessionLease:
            path = store.get_session(session_id).validate_workspace(workspace)
            lease = store.acquire_lease(session_id, path, ttl_s=ttl)
            try:
                replayed.extend(lease.replay_all())
                agent.load_history(replayed)  # decodes every payload: a corrupt one refuses here
                journal.verify_snapshot(store, lease, snapshot)  # every refusal before the first write
                if not replayed:
                    check_sources(snapshot, sources)
                open_turn = journal.read_journal(store, session_id)
                if open_turn is not None and open_turn.unknown:
                    raise journal.unknown_effects_error(session_id, open_turn)
                if model is not None:
                    store.bind_session_model(session_id, model)
                journal.require_snapshot(store, lease, snapshot)
                reconciled = journal.reconcile(store, lease)
                unknown = journal.unknown_effects(store, session_id)
                if reconciled is not None or unknown:
                    agent.load_history(lease.replay_all(), unknown)
            except BaseException:
                _release_quietly(lease)
                raise
            return lease

        lease = await _on(executors[0], setup, shutdown=executors)
        try:
            await _on(executors[1], functools.partial(_model_state, binding, "load_session_state", store,
                                                      session_id), shutdown=executors)
        except BaseException:  # the model's loading was stopped (Ctrl-C): give the lease back at once
            lease.close()
            raise
        return cls(store, lease, agent, ttl, executors, sources=sources, fresh=not replayed,
                   context=[e.payload for e in replayed if e.kind == CONTEXT_KIND])

    # -- state ----------------------------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The public Session ID."""
        return self._lease.session_id

    @property
    def workspace(self) -> Path:
        """The Session's workspace directory: where the lease last found the directory it holds open (it follows
        a rename during the Session); tools run there."""
        return Path(self._lease.path)

    @property
    def snapshot(self) -> SessionSnapshot:
        """The Session's execution snapshot."""
        return self.agent.snapshot

    @property
    def context(self) -> tuple[dict, ...]:
        """The context payloads in the Session's history, in order (each with its "source" and "text"): what its
        sources recorded before the first round, as replayed (a Summary that replaced them removes them)."""
        return tuple(self._context)

    @property
    def poisoned(self) -> bool:
        """True while a turn is running and after one that did not close durably (cancelled, dropped, or its failure
        could not be recorded): the adapter may then only be closed."""
        return self._poisoned

    @property
    def enabled_tools(self) -> frozenset[str]:
        """The snapshot tools the model may call now (process-local; a resume enables all)."""
        return self.agent.enabled_tools

    def disable_tool(self, name: str) -> None:
        """Stop offering snapshot tool `name`; see `AgentSession.disable_tool`."""
        self.agent.disable_tool(name)

    def enable_tool(self, name: str) -> None:
        """Offer snapshot tool `name` again; see `AgentSession.enable_tool`."""
        self.agent.enable_tool(name)

    # -- turns ------------------------------------------------------------------------------------------------

    def turn(self, text: str, *, approve: Approve | None = None,
             on_token: Callable[[str], None] | None = None,
             on_result: Callable[[ProposedCall, dict], None] | None = None,
             on_progress: Callable[[int, GenerationProgress], None] | None = None) -> asyncio.Task[TurnResult]:
        """Start one turn on the running loop and return its task (the adapter keeps a strong reference).

        The poison flag is armed before the task is created, so cancelling or
        dropping it at any point leaves the adapter poisoned. `approve(call,
        tool)` (a value or an awaitable of "approve", "deny" or "abort") is
        asked for every call whose snapshot approval is "always"; without it
        such calls are denied. `on_token` gets streamed text on the loop, and
        `on_result(call, tool_result)` the result of each call that ran or was
        answered from an identical call's earlier result (outcome "repeated"),
        once it is journaled (never for a result that could not be recorded).
        `on_progress(round, progress)` gets, on the loop, each progress report
        of model round `round` (1, 2, ...) when the binding reports progress
        (`AgentBinding`). Raises `AgentPoisonedError` when poisoned or closed and
        `TurnInProgressError` while a turn runs.
        """
        if self._task is not None and not self._task.done():
            raise TurnInProgressError(f"a turn of Session {self.session_id} is still running; await it first")
        if self._poisoned or self._closed:
            raise AgentPoisonedError(
                f"this agent of Session {self.session_id} is {'closed' if self._closed else 'poisoned'}; close it and "
                "resume the Session"
            )
        loop = asyncio.get_running_loop()
        self._poisoned = True
        self._stop.clear()
        self._task = loop.create_task(self._run_turn(text, approve, on_token, on_result, on_progress))
        return self._task

    def interrupt(self) -> None:
        """Stop generation between tokens (and start no further tool call); the turn closes with a failure record."""
        self._stop.set()

    async def _offload(self, executor: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on `executor` and await it: the one await of every blocking step of a turn. A database step is
        attempted again while the store is busy, for as long as the lease is valid (`journal.retry_busy`)."""
        step = functools.partial(fn, *args, **kwargs)
        if executor is self._db:
            step = functools.partial(journal.retry_busy, self._lease, step)
        return await asyncio.get_running_loop().run_in_executor(executor, step)

    async def _run_turn(self, text: str, approve: Approve | None, on_token: Callable[[str], None] | None,
                        on_result: Callable[[ProposedCall, dict], None] | None,
                        on_progress: Callable[[int, GenerationProgress], None] | None = None) -> TurnResult:
        context = await self._open(text)
        result = await self._rounds(approve, on_token, on_result, on_progress)
        return dataclasses.replace(result, context=context)

    async def _open(self, text: str) -> tuple[dict, ...]:
        """Open the turn: on a Session's first turn gather its context notes first, then the turn policy's note of
        this turn (`TurnPolicy.turn_note`), and record them with the input; the turn's walk of the workspace serves
        them and its rounds. A source that fails has written nothing: the error is raised and the adapter stays
        usable."""
        context: tuple[dict, ...] = ()
        walk = self.agent.walk = WorkspaceWalk(self.workspace, self.agent.exclude)  # read once for the whole turn
        if self._fresh:
            request = ContextRequest(self.store, self.session_id, self.workspace, text, self.agent.snapshot, walk)
            try:
                context = await self._offload(self._db, gather, self._sources, request)
            except Exception:
                self._poisoned = False
                raise
        policy = self.agent.policy
        note = await self._offload(self._tools, policy.turn_note, self.workspace, text, walk)
        context += () if note is None else ({**note, "source": policy.note_source},)
        opened = await self._offload(self._db, journal.open_turn, self.store, self._lease, text, context)
        self._input_seq = opened.last_seq  # the seq of the turn's input: its tools' `turn_seq`
        self._fresh = False
        self._context.extend(context)
        for payload in context:
            self.agent.add_context(payload)
        self.agent.add_user(text)
        return context

    async def _rounds(self, approve: Approve | None, on_token: Callable[[str], None] | None,
                      on_result: Callable[[ProposedCall, dict], None] | None,
                      on_progress: Callable[[int, GenerationProgress], None] | None) -> TurnResult:
        store, lease, agent = self.store, self._lease, self.agent
        limit = agent.snapshot.chain_limit
        rounds = calls = 0
        forced: str | None = None
        generating = False  # a round is being generated: an interrupt ends it, and it counts
        try:
            while True:
                if self._stop.is_set():
                    raise GenerationInterrupted()
                generating = True
                out = await self._offload(self._model, agent.generate_round, stop=self._stop,
                                          on_token=_on_loop(on_token), workspace=self.workspace, forced=forced,
                                          on_progress=_on_loop(
                                              on_progress and functools.partial(on_progress, rounds + 1)))
                rounds, generating = rounds + 1, False
                if out.answer is not None:
                    audit = {"event": "answer", "rounds": rounds, "calls": calls,
                             "model": agent.snapshot.model_reference}
                    if forced is not None:
                        audit["forced"] = forced
                    await self._offload(self._db, journal.close_answer, store, lease, out.answer, audit)
                    agent.add_answer(out.answer)
                    self._poisoned = False
                    return TurnResult("answer", out.answer, rounds, calls, forced=forced)
                if forced is not None:
                    return await self._fail("error", "the model proposed tool calls in a round constrained to an "
                                            "answer", rounds, calls)
                ended, stale = await self._run_batch(rounds, out, approve, on_result)
                calls += len(out.calls)
                if ended is not None:
                    return await self._fail(ended, _ENDINGS[ended], rounds, calls)
                forced = "chain_limit" if rounds >= limit else "repeat" if stale and agent.policy.forces_repeat else \
                    "answered" if agent.answered() else None
        except GenerationInterrupted as exc:  # its message, when the binding gives one, says where it stopped
            where = f" {exc}" if str(exc) else ""
            return await self._fail("interrupted", _ENDINGS["interrupted"] + where, rounds + generating, calls)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return await self._fail("error", f"{type(exc).__name__}: {exc}", rounds, calls, cause=exc)

    async def _run_batch(self, round_: int, out: Any, approve: Approve | None,
                         on_result: Callable[[ProposedCall, dict], None] | None) -> tuple[str | None, bool]:
        """Journal, run and publish one batch; return "aborted" / "interrupted" when the turn must end after it (else
        None), and whether every result of the batch was a repeat of one already in the turn."""
        store, lease, agent = self.store, self._lease, self.agent
        ids = [uuid.uuid4().hex for _ in out.calls]
        await self._offload(self._db, journal.plan_batch, store, lease, round_, out.raw,
                            [(cid, c.tool, c.arguments) for cid, c in zip(ids, out.calls)])
        ended: str | None = None
        new = False
        batch: dict[str, dict] = {}  # the result of each distinct call of this batch: an identical one is folded
        for index, (cid, call) in enumerate(zip(ids, out.calls)):
            if ended is None and self._stop.is_set():
                ended = "interrupted"
            first = batch.get(call_key(call.tool, call.arguments))
            if ended is None and first is not None:
                result, assets, ran = _folded(cid, call, first), (), False
            else:
                result, assets, ran = await self._decide(cid, call, index, approve) if ended is None else \
                    (None, (), False)
            if result == "abort":
                ended, result = "aborted", None
            if result is None:
                result = {"call_id": cid, "tool": call.tool, "outcome": "not_executed", "output": journal.NOT_EXECUTED}
            await self._offload(self._db, journal.complete_call, store, lease, cid, result, assets)
            batch.setdefault(call_key(call.tool, call.arguments), result)
            new = agent.record(call, result) or new
            if (ran or result["outcome"] == REPEATED) and on_result is not None:
                on_result(call, result)
        results = await self._offload(self._db, journal.publish_batch, store, lease)
        agent.add_batch(round_, list(zip(ids, out.calls)), results)
        return ended, not new

    async def _decide(self, cid: str, call: ProposedCall, index: int,
                      approve: Approve | None) -> tuple[Any, tuple, bool]:
        """Gate, ask, run one call (the `index`-th of its round): its `tool_result` payload (or "abort"), its assets,
        and whether it ran. A call identical to one already done in the turn is answered from that call's result,
        never asked nor run; a call the round did not offer is refused (`AgentSession.refusal`)."""
        reason = self.agent.gate(call)
        if reason is not None:
            return {"call_id": cid, "tool": call.tool, "outcome": "error", "output": reason}, (), False
        earlier = self.agent.earlier_result(call)
        if earlier is not None:
            return ({"call_id": cid, "tool": call.tool, "outcome": REPEATED, "output": earlier.get("output"),
                     "earlier_call_id": earlier.get("call_id"), "earlier_outcome": earlier.get("outcome")}, (), False)
        reason = self.agent.refusal(call, index)
        if reason is not None:
            return {"call_id": cid, "tool": call.tool, "outcome": "error", "output": reason}, (), False
        tool = self.agent.tools[call.tool]
        if self.agent.snapshot.tool(call.tool).approval == "always":
            decision = "deny" if approve is None else approve(call, tool)
            if inspect.isawaitable(decision):
                decision = await decision
            if decision not in DECISIONS:
                raise ValueError(f"approve() returned {decision!r}, not one of {DECISIONS}")
            if decision == "abort":
                return "abort", (), False
            if decision == "deny":
                return ({"call_id": cid, "tool": call.tool, "outcome": "denied", "output": "the user denied this call"},
                        (), False)
        await self._offload(self._db, journal.start_call, self.store, self._lease, cid)
        invocation = ToolInvocation(cid, call.tool, call.arguments, self.workspace, self.store, self.session_id,
                                    self._input_seq, functools.partial(self._record_process, cid, call.tool))
        known: list = []
        self._tool_call = (cid, known)  # left set when this await is cancelled: `close` settles the call
        result, assets = await self._offload(self._tools, _run_call, tool, invocation, known)
        self._tool_call = None
        self._processes.clear()
        return result, assets, True

    def _record_process(self, cid: str, tool: str, pid: int, label: str) -> None:
        """`ToolInvocation.track_process` of call `cid`, on the tool thread: identify the process and journal it
        (on the database thread, waiting for the write), then remember it for `running_processes`."""
        record = processes.identify(pid, label)
        self._db.submit(journal.retry_busy, self._lease, journal.record_process, self.store, self._lease, cid,
                        record).result()
        self._processes.append((tool, record))

    def running_processes(self) -> tuple[tuple[str, processes.ProcessRecord], ...]:
        """The processes the running tool call recorded that still run, each with its tool's name (what a chat
        leaving at once says keeps running)."""
        return tuple((tool, record) for tool, record in list(self._processes) if processes.status(record).running)

    def abandon(self) -> None:
        """For a process that ends at once (a second Ctrl-C): stop renewing and release the lease best-effort
        through a zero-wait connection (`SessionLease.close`; never blocks, never raises). The open turn stays in
        the journal, for resume or `emelex memory sessions recover`."""
        self._renewal.stopped.set()
        self._lease.close()

    async def _fail(self, reason: str, diagnostic: str, rounds: int, calls: int,
                    cause: BaseException | None = None) -> TurnResult:
        """Close the turn with a failure record (reconciling a journaled batch); the adapter stays poisoned when
        that write fails, and the error is raised."""
        try:
            await self._offload(self._db, journal.close_failed, self.store, self._lease, reason, diagnostic)
        except Exception as exc:
            raise exc from cause
        self.agent.load_history(*await self._offload(self._db, lambda: (
            list(self._lease.replay_all()), journal.unknown_effects(self.store, self.session_id))))
        self._poisoned = False
        return TurnResult(reason, None, rounds, calls, journal.bounded(diagnostic))

    # -- other uses of the lease ------------------------------------------------------------------------------

    async def set_title(self, title: str | None) -> None:
        """Change the Session's title through this adapter's own lease."""
        await self._offload(self._db, journal.set_title, self.store, self._lease, title)

    async def queue_compaction(self, *, force: bool = False) -> CompactionQueued:
        """Plan compaction for the snapshot's context size and queue it (`force`: even below the policy's trigger);
        never runs inference. The job waits while this adapter holds the lease: close, run `emelex memory work`,
        then resume."""
        return await self._offload(self._db, functools.partial(
            self.store.queue_compaction, self.session_id, context_window=self.agent.snapshot.context_size,
            force=force))

    async def close(self) -> None:
        """End the adapter: an unpoisoned one queues idempotent distillation and releases the lease (one
        transaction, `finish_session`); a poisoned one (or one with a turn still running, which is cancelled)
        releases only. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self._settle_tool()
            self._renewal.stopped.set()
            if self._poisoned:
                try:
                    await self._offload(self._db, _release_quietly, self._lease)
                except StoreBusyError:
                    self._lease.close()  # it expired while the store stayed locked: nothing is held any more
            else:
                await self._offload(self._model, _model_state, self.agent.binding, "save_session_state", self.store,
                                    self._lease)
                await self._offload(self._db, self.store.finish_session, self._lease)
        finally:
            self._renewal.stopped.set()
            self._finalizer.detach()
            for executor in (self._db, self._model, self._tools):
                executor.shutdown(wait=False)

    async def _settle_tool(self) -> None:
        """Before a cancelled turn's lease is released: wait (renewing) until a tool call still running on the tool
        thread returns, then record its known result (`complete_call`, a no-op when the turn did), so that the lease
        is never released while a tool runs and no known result is thrown away."""
        if self._tool_call is None:
            return
        cid, known = self._tool_call
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(self._tools.shutdown, wait=True))
        self._tool_call = None
        if known:
            result, assets = known[0]
            try:
                await self._offload(self._db, journal.complete_call, self.store, self._lease, cid, result, assets)
            except EmelexError:
                pass  # the call stays started: resume or `sessions recover` reports its effect as unknown


_ENDINGS = {
    "interrupted": "the turn was interrupted",
    "aborted": "the user aborted the turn at a tool call",
}


def _on_loop(callback: Callable[[Any], None] | None) -> Callable[[Any], None] | None:
    """`callback`, called on the running loop from the model thread."""
    if callback is None:
        return None
    loop = asyncio.get_running_loop()
    return lambda piece: loop.call_soon_threadsafe(callback, piece)


async def _on(executor: ThreadPoolExecutor, fn: Callable[[], Any], *, shutdown: tuple) -> Any:
    """Run `fn` on `executor`; on failure shut `shutdown` down and re-raise."""
    try:
        return await asyncio.get_running_loop().run_in_executor(executor, fn)
    except BaseException:
        for e in shutdown:
            e.shutdown(wait=False)
        raise


def _run_call(tool: RegisteredTool, invocation: ToolInvocation, known: list) -> tuple[dict, tuple]:
    """On the tool thread: run one call and build its `tool_result` payload and assets, kept in `known` too (for
    `close` when the turn awaiting it was cancelled)."""
    output = run_tool(tool, invocation)
    result = {"call_id": invocation.call_id, "tool": invocation.tool,
              "outcome": "error" if output.is_error else "ok", "output": output.text}
    if output.assets:
        result["assets"] = [ref.digest for ref in output.assets]
    known.append((result, tuple(output.assets)))
    return known[0]


def _model_state(binding: AgentBinding, method: str, *args: Any) -> None:
    """Call the binding's optional saved-state `method` (`load_session_state` on resume, `save_session_state` at a
    clean close; see emelex_llamacpp/binding.py), which never raises; a binding without it is left alone."""
    step = getattr(binding, method, None)
    if step is not None:
        step(*args)


def _home(store: MemoryStore) -> tuple[tuple[int, int], ...]:
    """The (st_dev, st_ino) of the store's Emelex Home, which no round offers as a workspace path; () when it
    cannot be seen."""
    try:
        info = Path(store.settings.home).stat()
    except OSError:
        return ()
    return ((info.st_dev, info.st_ino),)


def _release_quietly(lease: SessionLease) -> None:
    """Release a lease that may already be gone."""
    try:
        lease.release()
    except (LeaseLostError, LeaseExpiredError):
        pass


def _check_tools(snapshot: SessionSnapshot, tools: Mapping[str, RegisteredTool]) -> None:
    """Every snapshot tool must be registered with exactly the snapshot's authority."""
    for authority in snapshot.tools:
        tool = tools.get(authority.name)
        if tool is None or tool.authority() != authority:
            field, now = f"tools[{authority.name}]", "not registered"
            if tool is not None:
                probe = SessionSnapshot(**{**snapshot.__dict__, "tools": tuple(
                    tool.authority() if t.name == authority.name else t for t in snapshot.tools)})
                field = snapshot.differing_field(probe) or field
                now = journal.bounded(repr(probe.field_value(field)), 200)
            error = SnapshotMismatchError(
                f"the registered tools differ from the Session's snapshot in {field} (recorded "
                f"{journal.bounded(repr(snapshot.field_value(field)), 200)}, registered now {now}); install the "
                "plugin version the Session was created with, or start a new Session"
            )
            error.field = field
            raise error


def _folded(cid: str, call: ProposedCall, first: dict) -> dict:
    """The `tool_result` of a call identical to one earlier in its own batch (`first`, that call's result): answered
    from it, never asked nor run again, whatever ran between them."""
    if first.get("outcome") == REPEATED:
        return {**first, "call_id": cid}
    return {"call_id": cid, "tool": call.tool, "outcome": REPEATED, "output": first.get("output"),
            "earlier_call_id": first.get("call_id"), "earlier_outcome": first.get("outcome")}
