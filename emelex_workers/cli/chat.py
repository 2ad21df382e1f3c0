"""`emelex chat`: an attended chat with the local model and the registered tools, on a durable agent Session.

The workspace is checked before the model loads (for a resume, it must be
the Session's workspace). Replies stream as they are generated. Every call
of a tool whose approval policy is "always" is asked once: approve, deny,
or abort the turn. Ctrl-C while the model works (the prompt's evaluation
or generation) interrupts the turn at once; during a tool it waits for the
tool. A second Ctrl-C exits at once: it releases the lease (best-effort,
without waiting) and says what it leaves behind: a command the tool started
that keeps running (recorded in the journal: `emelex memory sessions recover
--stop-running` stops it), a call whose effect is unknown, or a turn the next
resume closes. Ctrl-C while the model loads, before the first prompt, ends
the chat (status 130) with nothing changed. Input is read line by line from
standard input, so a script can drive it.

A new Session recalls workspace Knowledge at its first turn (the "recall"
context source, `emelex_workers.agent.recall`) and has the memory tools;
`--no-recall` records in its snapshot that it has neither. The chat says how
many notes it recalled, and `/memory` lists them with their sources.

On a terminal a status line shows, in place, what the model is doing while
it works (the round, the prompt's evaluation or the tokens generated, the
turn's time); every turn ends with one line of its time, rounds, tool calls
and, when the binding reports them, tokens. A line typed on a terminal while
no prompt waits for one (a turn is running) is not sent: the chat says so
and drops it, so nothing typed ahead runs later or answers an approval
prompt it was not typed for. From a script (standard input not a terminal)
every line is kept and answers the next prompt, in order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

import typer

from emelex_memory import EmelexError, MemoryStore
from emelex_memory.agent import journal
from emelex_memory.agent.journal import REPEATED
from emelex_memory.agent.snapshot import SessionSnapshot
from emelex_memory.errors import ModelNotInstalledError, SessionNotFoundError, SnapshotMismatchError, \
    WorkspaceReplacedError
from emelex_memory.sessions.identity import WorkspaceIdentity
from emelex_workers.agent import workspace_map
from emelex_workers.agent.durable import DurableAgentSession, build_snapshot, calls_tools_natively
from emelex_workers.agent.errors import UnknownToolError
from emelex_workers.agent.policies import registered_policies
from emelex_workers.agent.protocol import PROTOCOL_NATIVE, PROTOCOL_VERSION, PROTOCOLS, ProposedCall, StringScanner, \
    parse_round
from emelex_workers.agent.recall import RECALL_SOURCE, recall_budget, recall_source, recalled_notes, \
    without_memory_tools
from emelex_workers.agent.tools import RegisteredTool, registered_tools
from emelex_workers.models import ModelManager
from emelex_workers.host.manager import bind_model, get_plugin_manager
from emelex_workers.host.policies import TurnPolicy, call_key
from emelex_workers.host.types import GenerationInterrupted
from emelex_workers.worker.stopping import GracefulStop

from .chat_sessions import CHOICES, choose_session, last_turns, title_of, workspace_chats
from .chat_policy import new_chat_policy, policy_line, requested_policy, resumed_chat_policy
from .chat_show import StatusLine, TrackedOutput, TurnProgress, approval_text, call_line, ending_line, outcome_lines
from .common import CHOOSE, SaidAtOnce, settings_of

SYSTEM_PROMPT = ("You are a careful coding assistant working in the user's workspace. Use a tool when you need "
                 "to look at or change files; otherwise answer briefly.")
COMMANDS = (
    ("/tools", "list the tools, whether each is enabled and whether it asks before it runs"),
    ("/tools disable NAME", "stop offering tool NAME to the model (this chat only)"),
    ("/tools enable NAME", "offer tool NAME again"),
    ("/memory", "the notes this Session recalled at its first turn, with their sources"),
    ("/compact", "queue compaction of this Session (it runs once the chat has ended)"),
    ("/compact --force", "queue compaction even below the 80% threshold (the newest turns are kept)"),
    ("/help", "this list"),
    ("/exit", "end the chat (so does end of input, Ctrl-D)"),
)
HELP = "commands: " + ", ".join(usage for usage, _ in COMMANDS)
TYPED_AHEAD = "(not sent: {!r} was typed while the turn ran; type it again at the prompt)"
TICK_S = 0.2  # how often the status line is redrawn
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141  # 128 + SIGPIPE: standard output was closed
EXIT_TERMINATED = 143  # 128 + SIGTERM
ANSWER_START = '"answer"'
CONTEXT = (workspace_map.SOURCE,)  # what a new chat's first turn records before its first round
CONTEXT_SOURCES = {workspace_map.SOURCE: workspace_map.workspace_map_source}
REMEMBER_ADVICE = "`emelex memory knowledge remember --new-workspace` (new_workspace=True in the library)"


class AnswerStream:
    """Prints the answer text of a streamed round as it arrives (the JSON string after `"answer":`), nothing of a
    tool-call round; `on_round` gets each complete round's text; `before_write` is called before answer text is
    written; `text` is what the current round received. Each streamed character is read once (`StringScanner`;
    a round's whole text is decoded once more when its object closes), so a long reply costs time in proportion to
    its length."""

    def __init__(self, on_round: Callable[[str], None] | None = None,
                 before_write: Callable[[], None] | None = None) -> None:
        self._on_round = on_round
        self._before_write = before_write
        self._written = False  # a complete round of this one wrote answer text, on a line not yet ended
        self.next_round()

    def next_round(self) -> None:
        """A new round starts: drop what is left of the last one (a round the adapter ended at a runaway
        repetition never streamed its closing brackets, and must not swallow the next)."""
        self.text, self._shown, self._written = "", 0, False
        self._answer: bool | None = None  # whether the round is an answer: known once its first key was read
        self._scanner = StringScanner()

    @property
    def answering(self) -> bool:
        """True once the current round has written answer text (the line it is on is not yet ended), also after its
        answer is complete: nothing may be drawn over that line."""
        return self._shown > 0 or self._written

    def feed(self, piece: str) -> None:
        """Take one streamed piece and print the answer characters it completes; a complete round is dropped so
        that the next round starts afresh."""
        self.text += piece
        scanner = self._scanner
        scanner.feed(piece)
        if self._answer is None and (scanner.strings > 1 or (scanner.strings == 1 and not scanner.inside)):
            head = self.text.lstrip()
            self._answer = head.startswith("{") and ANSWER_START in head[:16]
        if self._answer and scanner.strings == 2:  # in, or just after, the answer's string (its second)
            new = scanner.tail(scanner.length - self._shown).text if scanner.inside else \
                scanner.closed[self._shown:]  # only what is new
            if new:
                if self._before_write is not None:
                    self._before_write()
                sys.stdout.write(new)
                sys.stdout.flush()
                self._shown += len(new)
        if scanner.depth == 0 and scanner.strings and piece.rstrip().endswith("}"):
            try:
                _, end = json.JSONDecoder().raw_decode(self.text.lstrip())
            except ValueError:
                end = 0
            if end:
                if self._on_round is not None:
                    self._on_round(self.text.lstrip()[:end])
                written = self._written or self._shown > 0
                rest = self.text.lstrip()[end:]
                self.next_round()
                self._written = written
                if rest.strip():
                    self.feed(rest)


class Chat:
    """The interactive loop over one `DurableAgentSession`; see the module docstring."""

    def __init__(self, agent: DurableAgentSession, lines: asyncio.Queue, *, terminal_input: bool = False,
                 terminal_output: bool = False) -> None:
        """Drive `agent` with input `lines` (str, or None at end of input; `receive` puts them there).
        `terminal_input`: standard input is a terminal (a line typed while no prompt waits is dropped);
        `terminal_output`: standard output is one (the status line is drawn, where `sys.stdout`, a `TrackedOutput`,
        says the cursor is on an empty line)."""
        self.agent = agent
        self.lines = lines
        self.terminal_input = terminal_input
        output = sys.stdout if isinstance(sys.stdout, TrackedOutput) else TrackedOutput(sys.stdout)
        self.status = StatusLine(output, terminal_output)
        self.reading = False  # a prompt waits for a line
        self.working = False  # the model is working: the status line is drawn
        self.progress: TurnProgress | None = None
        self.stream: AnswerStream | None = None
        self.turn: asyncio.Task | None = None
        self.in_tool = False
        self.interrupts = 0
        self.approval: asyncio.Future | None = None
        self.ended = False
        self.stopped: int | None = None  # the exit status once SIGTERM or a closed stdout ends the chat
        self.recalling = False  # the next turn is a new Session's first: say how many notes it recalled
        self.policy_line = ""  # which turn policy the chat runs and why (on the first line), then what it does
        self.folded: set[str] = set()  # the calls the latest round proposed more than once
        self.untitled = False  # the Session has no title yet: its next message gives it one
        self.history: list[str] = []  # what a resumed chat prints of its last turns before its first prompt
        self.one_shot: str | None = None  # `-p`: the one message to answer, then the chat ends
        self.answered = True  # every turn so far ended with an answer

    def stop(self, code: int) -> None:
        """End the chat with exit status `code` (SIGTERM, or a closed standard output, which is then silenced):
        stop reading, interrupt and cancel a running turn (leaving the adapter poisoned); `run` then closes the
        adapter, which keeps the lease until a running tool returns, records its result, and releases the lease.
        Idempotent."""
        if self.stopped is not None:
            return
        self.stopped = code
        if code == EXIT_PIPE:
            _silence_stdout()
        self.lines.put_nowait(None)
        if self.turn is not None and not self.turn.done():
            if self.in_tool:
                self.say("\nending the chat: waiting for the running tool to return before the lease is released")
            self.agent.interrupt()
            self.turn.cancel()

    def say(self, text: str) -> None:
        """Print `text` as a line of its own (the status line erased first)."""
        self.status.clear()
        print(text, flush=True)

    def receive(self, line: str | None) -> None:
        """Take one line from standard input (None: its end). A waiting prompt gets it (one line per prompt); so
        does the next prompt when input is not a terminal. On a terminal, a line typed while no prompt waits is
        dropped, saying so (an empty one silently); the end of input is kept, and ends the chat at the next
        prompt."""
        if self.reading or not self.terminal_input:
            self.reading = False
            self.lines.put_nowait(line)
            return
        midline = "\n" if self.stream is not None and self.stream.answering else ""  # an answer's line goes on
        if line is None:
            self.lines.put_nowait(None)
            self.say(f"{midline}(end of input: the chat ends when this turn does)")
        elif line.strip():
            self.say(midline + TYPED_AHEAD.format(line.strip()))

    async def read(self, prompt: str) -> str | None:
        """The next input line (stripped), or None at end of input (and at every read after it)."""
        self.status.clear()
        sys.stdout.write(prompt)
        sys.stdout.flush()
        if self.ended:
            return None
        self.reading = True
        try:
            line = await self.lines.get()
        finally:
            self.reading = False
        if line is not None and self.terminal_input:
            self.status.output.at_line_start = True  # the terminal echoed the line and its Enter
        self.ended = line is None
        return None if line is None else line.strip()

    def on_sigint(self) -> None:
        """Ctrl-C: abort an approval prompt, interrupt a turn (waiting for a running tool), exit on the second."""
        if self.turn is None or self.turn.done():
            self.lines.put_nowait(None)
            return
        self.interrupts += 1
        if self.approval is not None and not self.approval.done():
            self.approval.set_result("abort")
            return
        if self.interrupts >= 2:
            self.say(f"\nexiting now; {self._left_behind()}")
            self.agent.abandon()
            os._exit(EXIT_INTERRUPTED)
        self.agent.interrupt()
        waiting = " (waiting for the running tool; Ctrl-C again to exit now)" if self.in_tool else ""
        self.say(f"\ninterrupting the turn{waiting}")

    def _left_behind(self) -> str:
        """What a chat leaving at once (a second Ctrl-C) leaves, and what to do about it: the processes the running
        tool call started that keep running, a tool call whose effect is unknown, or an interrupted turn that the
        next resume closes."""
        sid = self.agent.session_id
        running = self.agent.running_processes()
        if running:
            named = ", ".join(f"`{tool}`'s {record.describe()}" for tool, record in running)
            return (f"{named} keeps running: wait for it to end, or stop it with `emelex memory sessions recover "
                    f"{sid} --stop-running`; then `emelex memory sessions recover {sid} --accept-unknown-effects` "
                    "settles the call")
        if self.in_tool:
            return (f"the running tool call may or may not have finished: check what it did, then run `emelex memory "
                    f"sessions recover {sid} --accept-unknown-effects`")
        return f"the interrupted turn is closed when the Session is resumed: `emelex chat --resume {sid}`"

    async def approve(self, call: ProposedCall, tool: RegisteredTool) -> str:
        """Ask once for one call, showing what it would do (`approval_text`): approve, deny, or abort the turn (end
        of input aborts)."""
        self.working = False
        self.say(await asyncio.to_thread(approval_text, call, tool, self.agent.workspace))
        while True:
            self.approval = asyncio.get_running_loop().create_future()
            reader = asyncio.ensure_future(self.read("approve this call? [y]es / [n]o / [a]bort the turn: "))
            done, _ = await asyncio.wait({reader, self.approval}, return_when=asyncio.FIRST_COMPLETED)
            asked, self.approval = self.approval, None
            if asked in done or reader.result() is None:
                reader.cancel()
                print(f"\n{outcome_lines(call.tool, 'not executed', 'the turn is aborted')}")
                return "abort"
            answer = reader.result()
            decision = {"y": "approve", "yes": "approve", "n": "deny", "no": "deny", "a": "abort",
                        "abort": "abort"}.get(answer.lower())
            if decision is not None:
                self.in_tool = decision == "approve"
                if decision != "approve":
                    print(outcome_lines(call.tool, "denied" if decision == "deny" else "not executed",
                                        "the user denied this call" if decision == "deny" else "the turn is aborted"))
                return decision
            print("please answer y, n or a")

    def show_result(self, call: ProposedCall, result: dict) -> None:
        """Show the outcome of a call that ran, once its result is journaled (printed from a loop callback, so a
        closed standard output stops the chat instead of failing the turn); a call folded into an identical one of
        its round (said when the round was shown) shows nothing more."""
        if result["outcome"] == REPEATED and call_key(call.tool, call.arguments) in self.folded:
            return
        text = outcome_lines(call.tool, result["outcome"], result["output"])
        asyncio.get_running_loop().call_soon(self.say, text)

    def show_round(self, raw: str) -> None:
        """Show the calls a complete model round proposed (and why the gate refuses any), before they run: each
        distinct call once, saying how many times the round proposed it (it runs once)."""
        self.working = False
        if self.progress is not None:
            self.progress.round_done()
        try:
            calls = parse_round(raw).calls
        except EmelexError:
            return  # the turn fails with the parse error, which run_turn shows
        keys = [call_key(call.tool, call.arguments) for call in calls]
        self.folded = {key for key in keys if keys.count(key) > 1}
        for index, call in enumerate(calls):
            if keys.index(keys[index]) != index:
                continue
            refused = self.agent.agent.refusal(call, index)
            times = keys.count(keys[index])
            folded = f" (proposed {times} times in this round; it runs once)" if times > 1 else ""
            self.say(f"\n{call_line(call)}{folded}" +
                     (f"\n{outcome_lines(call.tool, 'refused', refused)}" if refused else ""))

    async def command(self, line: str) -> bool:
        """Run one slash command; False when the chat should end."""
        words = line.split()
        if words == ["/exit"]:
            return False
        if words == ["/help"]:
            for usage, what in COMMANDS:
                print(f"  {usage:<20} {what}")
            print("  anything else is sent to the model as your message")
        elif words == ["/tools"]:
            for authority in self.agent.snapshot.tools:
                state = "enabled" if authority.name in self.agent.enabled_tools else "disabled"
                ask = ", asks first" if authority.approval == "always" else ""
                print(f"  {authority.name:<14} {state}{ask}  {authority.description}")
        elif len(words) == 3 and words[:2] in (["/tools", "disable"], ["/tools", "enable"]):
            try:
                (self.agent.disable_tool if words[1] == "disable" else self.agent.enable_tool)(words[2])
                print(f"{words[2]} {words[1]}d")
            except UnknownToolError as exc:
                print(f"error: {exc}")
        elif words == ["/memory"]:
            print(memory_text(self.agent.snapshot, self.agent.context))
        elif len(words) == 2 and words[:2] in (["/tools", "disable"], ["/tools", "enable"]):
            print(f"usage: /tools {words[1]} NAME (the names: /tools)")
        elif words in (["/compact"], ["/compact", "--force"]):
            queued = await self.agent.queue_compaction(force=len(words) == 2)
            if queued.job is None:
                print(f"nothing to compact: {queued.reason}")
            else:
                print(f"compaction queued (job {queued.job.id}); it cannot run while this chat holds the Session: "
                      f"/exit, run `emelex memory work`, then `emelex chat --resume {self.agent.session_id}`")
        else:
            near = difflib.get_close_matches(words[0], sorted({usage.split()[0] for usage, _ in COMMANDS}), n=1,
                                             cutoff=0.6)
            guess = f"did you mean {near[0]}? " if near else ""
            print(f"unknown command {line!r}; {guess}{HELP} (a message to the model must not start with /)")
        return True

    async def run(self) -> int:
        """The loop: read, run turns and commands until /exit or end of input (or `stop`), then close the adapter
        (releasing the lease); the exit status. A turn that raised (its failure could not be recorded) closes the
        adapter too, releasing the lease, before its error propagates."""
        try:
            await self._loop()
        except BrokenPipeError:
            self.stop(EXIT_PIPE)
        except asyncio.CancelledError:  # the turn `stop` cancelled
            if self.stopped is None:
                await self._close_quietly()
                raise
        except BaseException:
            await self._close_quietly()
            raise
        await self.agent.close()
        if self.stopped is not None:
            print(f"chat ended ({'standard output closed' if self.stopped == EXIT_PIPE else 'terminated'}); "
                  f"Session {self.agent.session_id}'s lease is released: resume it with "
                  f"`emelex chat --resume {self.agent.session_id}`", file=sys.stderr, flush=True)
            return self.stopped
        print(f"session {self.agent.session_id} closed", file=sys.stderr if self.one_shot is not None else sys.stdout)
        return 0 if self.answered or self.one_shot is None else 1

    async def _close_quietly(self) -> None:
        """Close the adapter while an error propagates: a failing close never replaces it (the lease then
        expires)."""
        try:
            await self.agent.close()
        except Exception:
            pass

    async def _loop(self) -> None:
        if self.one_shot is not None:  # `-p`: the answer on standard output, the rest as a script expects it
            print(f"session {self.agent.session_id}", file=sys.stderr, flush=True)
            await self.run_turn(self.one_shot)
            return
        head, _, rest = self.policy_line.partition("\n")
        print(f"session {self.agent.session_id}; {head + '; ' if head else ''}{HELP}")
        if rest:
            print(rest)
        for line in self.history:
            print(line)
        while True:
            line = await self.read("> ")
            if line is None:
                print()  # end the prompt's line
                break
            if not line:
                continue
            if line.startswith("/"):
                if not await self.command(line):
                    break
                continue
            await self.run_turn(line)

    async def run_turn(self, text: str) -> None:
        """One turn, streamed (with the status line while the model works, on a terminal), then how it ended and
        the turn's time, rounds, tool calls and tokens."""
        if self.untitled:
            self.untitled = False
            await self.agent.set_title(title_of(text))
        self.stream = stream = AnswerStream(self.show_round, self._answer_starts)
        self.progress = progress = TurnProgress(time.monotonic())
        self.interrupts, self.in_tool, self.working = 0, False, True

        def on_token(piece: str) -> None:
            self.in_tool = False
            progress.streamed(piece)
            self.working = not stream.answering
            stream.feed(piece)

        rounds = [0]

        def on_progress(round_: int, report) -> None:
            if round_ != rounds[0]:
                rounds[0] = round_
                stream.next_round()
            progress.report(round_, report)
            self.working = not stream.answering

        ticker = asyncio.ensure_future(self._tick()) if self.status.live else None
        self.turn = self.agent.turn(text, approve=self.approve, on_token=on_token, on_result=self.show_result,
                                    on_progress=on_progress)
        try:
            result = await self.turn
        finally:
            self.working = self.in_tool = False
            if ticker is not None:
                ticker.cancel()
            self.status.clear()
        self.stream = None
        self.answered = self.answered and result.outcome == "answer"
        print()  # ends the answer's line; before a turn without one, a blank line
        ending = ending_line(result)
        if ending is not None:
            print(ending)
        if self.recalling:  # what the turn recalled, before the line that ends it
            self.recalling = False
            print(recall_line(result.context), file=sys.stderr if self.one_shot is not None else sys.stdout)
        print(progress.summary(result, time.monotonic()), file=sys.stderr if self.one_shot is not None else sys.stdout)

    def _answer_starts(self) -> None:
        """Answer text is about to be written: the status line gives way to it."""
        self.working = False
        self.status.clear()

    async def _tick(self) -> None:
        """Redraw the status line every `TICK_S` while the model works."""
        while True:
            if self.working and self.progress is not None:
                self.status.show(self.progress.status(time.monotonic()))
            await asyncio.sleep(TICK_S)


def recall_line(context: tuple[dict, ...]) -> str:
    """The line a new Session's first turn prints: how many notes it recalled (the context recorded by that turn)."""
    count = len(recalled_notes(context))
    if not count:
        return "[no notes recalled from earlier Sessions]"
    return f"[recalled {count} note{'s' if count != 1 else ''} from earlier Sessions; /memory lists them]"


def memory_text(snapshot: SessionSnapshot, context: tuple[dict, ...]) -> str:
    """What `/memory` prints: the notes the Session recalled, each Knowledge note with its key, version, source
    (Session ID prefix, turn and seqs) and the date it was said, each transcript turn with its Session, date and
    event, or why there are none (a note recorded without a date is shown without one)."""
    if RECALL_SOURCE not in snapshot.context:
        return "this Session was started with --no-recall: it recalls no notes and has no memory tools"
    notes = recalled_notes(context)
    if not notes:
        return "this Session recalled no notes (none of this workspace's Knowledge was pinned or relevant)"
    lines = [f"{len(notes)} note{'s' if len(notes) != 1 else ''} recalled at the first turn (from earlier "
             "Sessions; they may be outdated):"]
    for note in notes:
        if note.get("kind") == "session":
            title = f' "{note["title"]}"' if note.get("title") else ""
            lines.append(f"  turn {note['turn']} of Session {note['session'][:8]}{title} ({note['date']}, event "
                         f"{note['seq']}, {note['speaker']})\n    {note['content']}")
            continue
        source = note["source"]
        origin = "no Session (remembered by hand)" if source is None else \
            f"Session {source['session'][:8]} turn {source['turn']} (events {source['first_seq']}-{source['last_seq']})"
        pinned = ", pinned" if note["pinned"] else ""
        said = f", said {note['date']}" if note.get("date") else ""
        lines.append(f"  {note['key']} v{note['version']}{pinned}  from {origin}{said}\n    {note['content']}")
    return "\n".join(lines)


def _silence_stdout() -> None:
    """Point standard output at the null device, so that nothing more written to a closed pipe fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _on_loop_error(chat: Chat, loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """A closed standard output met in a loop callback (streamed text, a tool's lines) stops the chat; anything
    else goes to the loop's default handler."""
    if isinstance(context.get("exception"), BrokenPipeError):
        chat.stop(EXIT_PIPE)
    else:
        loop.default_exception_handler(context)


def _reader(loop: asyncio.AbstractEventLoop, receive: Callable[[str | None], None]) -> None:
    for line in sys.stdin:
        loop.call_soon_threadsafe(receive, line)
    loop.call_soon_threadsafe(receive, None)


async def _main(store, workspace, binding, tools, snapshot, resume: str | None, model, new_workspace: bool,
                policies: Mapping[str, TurnPolicy], policy_text: str, stop: GracefulStop,
                one_shot: str | None) -> int:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue = asyncio.Queue()
    tracked = sys.stdout = TrackedOutput(sys.stdout)  # where the cursor is, for the status line
    try:
        return await _chat(store, workspace, binding, tools, snapshot, resume, model, new_workspace, policies,
                           policy_text, stop, one_shot, loop, lines)
    finally:
        sys.stdout = tracked.stream


async def _chat(store, workspace, binding, tools, snapshot, resume: str | None, model, new_workspace: bool,
                policies: Mapping[str, TurnPolicy], policy_text: str, stop: GracefulStop, one_shot: str | None, loop,
                lines: asyncio.Queue) -> int:
    sources = {**CONTEXT_SOURCES,
               RECALL_SOURCE: recall_source(recall_budget(store.settings, snapshot.context_size))}
    if resume is None:
        agent = await DurableAgentSession.create(store, workspace, binding, tools, snapshot, model=model,
                                                new_workspace=new_workspace, context_sources=sources,
                                                policies=policies)
    else:
        agent = await DurableAgentSession.resume(store, resume, workspace, binding, tools, snapshot, model=model,
                                                 context_sources=sources, policies=policies)
    if stop.requested is not None:  # Ctrl-C while the Session opened: end it before the first prompt
        await agent.close()
        return _stopped_before_start(stop, f"Session {agent.session_id} is closed; resume it with "
                                           f"`emelex chat --resume {agent.session_id}`")
    chat = Chat(agent, lines, terminal_input=sys.stdin.isatty(), terminal_output=sys.stdout.isatty())
    chat.policy_line = policy_text
    chat.one_shot = one_shot
    chat.untitled = (await asyncio.to_thread(store.get_session, agent.session_id)).title is None
    if resume is not None and one_shot is None:
        chat.history = await asyncio.to_thread(last_turns, store, agent.session_id)
    chat.recalling = resume is None and RECALL_SOURCE in snapshot.context
    threading.Thread(target=_reader, args=(loop, chat.receive), daemon=True).start()
    loop.add_signal_handler(signal.SIGINT, chat.on_sigint)
    loop.add_signal_handler(signal.SIGTERM, chat.stop, EXIT_TERMINATED)
    loop.set_exception_handler(functools.partial(_on_loop_error, chat))
    try:
        return await chat.run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)


def _resumed_snapshot(stored: SessionSnapshot, binding, tools: dict[str, RegisteredTool], installed,
                      policy: TurnPolicy | None = None) -> SessionSnapshot:
    """The snapshot a resume runs with: the Session's own recorded values (sampling, limits, system prompt, the
    turn policy it recorded (`policy`, the one this host provides under its name), the protocol version when this
    process still renders it and this binding can still run it, and the model snapshot ID it recorded, as
    `installed` has the recorded content: `_session_model` checked its reference), and what this process provides
    (a protocol it does not render, or tools called natively by a binding that no longer can, the chat template,
    the tools and the window the binding allocated for the recorded context size), which the resume compares with
    the record, refusing only those that differ."""
    protocol = stored.protocol if stored.protocol in PROTOCOLS else PROTOCOL_VERSION
    if protocol == PROTOCOL_NATIVE and not calls_tools_natively(binding):
        protocol = policy.protocol(False) if policy is not None else PROTOCOL_VERSION
    snapshot = build_snapshot(
        binding, tools, model_reference=installed.reference, model_snapshot_id=stored.model_snapshot_id,
        system_prompt=stored.system_prompt, context_size=binding.context_window, temperature=stored.temperature,
        seed=stored.seed, round_tokens=stored.round_tokens, chain_limit=stored.chain_limit,
        calls_per_batch=stored.calls_per_batch, context=stored.context, protocol=protocol)
    return dataclasses.replace(snapshot, policy=None if stored.policy is None or policy is None else policy.describe())


def _session_model(manager: ModelManager, session_id: str, reference: str, model: str | None):
    """The installed model a resumed Session's snapshot names by `reference` (`NAME@sha256:...`): `model` when
    given, else the one of that name. `SnapshotMismatchError` names the model and the `--model` flag when `model`
    differs, or says the installed snapshot of that name is not the Session's; `ModelNotInstalledError` says which
    model to install."""
    name = reference.split("@", 1)[0]
    try:
        installed = manager.get(model or name)
    except ModelNotInstalledError:
        if model:
            raise
        raise ModelNotInstalledError(
            f"Session {session_id} needs model {name} ({reference}), which is not installed; install it with "
            f"`emelex models install FILE --name {name}`"
        ) from None
    if installed.reference == reference:
        return installed
    if installed.name != name:
        error = SnapshotMismatchError(
            f"Session {session_id} was created with model {name}, not {installed.name}; resume it with "
            f"`--model {name}`, or start a new Session"
        )
    else:
        error = SnapshotMismatchError(
            f"Session {session_id} was created with model {reference}, but {name} is now {installed.reference}; "
            "reinstall the Session's model file under that name, or start a new Session"
        )
    error.field = "model_reference"
    raise error


def _found_session(settings, workspace: Path, latest: bool) -> str:
    """The Session `--continue` (`latest`) or a bare `--resume` resumes: the latest chat Session of `workspace`, or
    the one the person chooses from its recent ones; `SessionNotFoundError` when it has none, `typer.Exit` when
    none is chosen."""
    with MemoryStore.open(settings, create=False) as store:
        sessions = workspace_chats(store, workspace, 1 if latest else CHOICES)
    if not sessions:
        raise SessionNotFoundError(f"no chat Session in {Path(workspace).resolve()} to resume; start one with "
                                   "`emelex chat` (`emelex memory sessions list` lists every Session)")
    if latest:
        return sessions[0].id
    chosen = choose_session(sessions, _ask, print)
    if chosen is None:
        print("no Session chosen; nothing was resumed")
        raise typer.Exit(0)
    return chosen


def _ask(question: str) -> str | None:
    """One line typed after `question` (None at the end of input)."""
    try:
        return input(question)
    except EOFError:
        print()
        return None


def chat(
    ctx: typer.Context,
    workspace: Annotated[Path, typer.Option("--workspace", metavar="DIR", help="The workspace (default: here).")]
    = Path("."),
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="[SESSION]", help="Resume this Session (an ID or a unique prefix); without one, choose "
        "from this workspace's recent chat Sessions.")] = None,
    continue_: Annotated[bool, typer.Option(
        "--continue", "-c", help="Resume the latest chat Session of this workspace.")] = False,
    prompt: Annotated[str | None, typer.Option(
        "--prompt", "-p", metavar="MESSAGE", help="Answer MESSAGE in one turn and exit (status 0 when the turn "
        "answered, 1 when not): the answer on standard output, the Session and the turn's figures on standard "
        "error; approvals are read from standard input.")] = None,
    model: Annotated[str | None, typer.Option("--model", metavar="NAME", help="An installed model.")] = None,
    new_workspace: Annotated[bool, typer.Option(
        "--new-workspace", help="The directory is a new workspace, unrelated to one last seen at its path.")] = False,
    no_recall: Annotated[bool, typer.Option(
        "--no-recall", help="Start a Session that recalls no Knowledge and has no recall or remember tool (a "
        "resumed Session keeps the choice it was started with).")] = False,
    policy_name: Annotated[str | None, typer.Option(
        "--policy", metavar="NAME", help="The turn policy of a new Session: guided (answers quote what was read), "
        "open (the model's own words), a plugin's, or auto (the chat_policy setting's default: by the model's "
        "size). A resumed Session keeps the one it recorded.")] = None,
) -> None:
    """Chat with the local model and its tools in a durable Session (new, --continue the latest, or --resume one)."""
    settings = settings_of(ctx)
    if continue_ and resume is not None:
        raise typer.BadParameter("--continue resumes the latest Session; it cannot be used with --resume")
    if continue_ or resume == CHOOSE:
        resume = _found_session(settings, workspace, continue_)
    if new_workspace and resume is not None:
        raise typer.BadParameter("--new-workspace starts a new Session; it cannot be used with --resume")
    if no_recall and resume is not None:
        raise typer.BadParameter("--no-recall starts a new Session; a resumed Session keeps the choice it was "
                                 "started with")
    say = SaidAtOnce()
    stop = GracefulStop(on_request=lambda name: say(f"stopping ({name}): the chat ends once the model stops starting"),
                        on_repeat=lambda name: _stop_at_once(name, say))
    try:
        with stop.installed():  # until the chat's loop takes SIGINT and SIGTERM over: the model's loading stops
            try:
                code = _run(settings, workspace, resume, model, new_workspace, no_recall, policy_name, stop, prompt)
            except GenerationInterrupted as exc:
                code = _stopped_before_start(stop, f"the chat stopped {exc or 'while the model started'}; nothing "
                                                   "of its Session was changed")
    finally:
        say.close()
    raise typer.Exit(code)


def _stop_at_once(name: str, say: SaidAtOnce) -> None:
    """A second stop request before the chat's prompt (from the signal handler): end the process at once, 128+N.
    Nothing is held yet but a lease being taken, which then expires."""
    say(f"stopped at once ({name})", raw=True)
    os._exit(128 + signal.Signals[name].value if name in signal.Signals.__members__ else EXIT_INTERRUPTED)


def _stopped_before_start(stop: GracefulStop, what: str) -> int:
    """Say how a chat stopped before its first prompt (`what` happened); the exit status, 128+N of the signal."""
    print(f"chat stopped by {stop.requested}: {what}", file=sys.stderr, flush=True)
    name = stop.requested or "SIGINT"
    return 128 + signal.Signals[name].value if name in signal.Signals.__members__ else EXIT_INTERRUPTED


def _run(settings, workspace: Path, resume: str | None, model: str | None, new_workspace: bool, no_recall: bool,
         policy_name: str | None, stop: GracefulStop, prompt: str | None = None) -> int:
    """The chat command's work, once its options are checked: open the store, bind and load the model (stopping
    once `stop` is set), run the chat; its exit status."""
    pm = get_plugin_manager(settings)
    policies = registered_policies(pm)
    if resume is None:  # a refused new chat creates nothing: check the workspace, the model and the policy first
        WorkspaceIdentity.inspect(workspace)
        with ModelManager(settings) as manager:
            installed = manager.get(model) if model else manager.default()
        requested = requested_policy(policies, policy_name, settings.chat_policy)
    store = MemoryStore.open(settings, create=resume is None)  # a resume needs a store: never create one for it
    try:
        session_id = stored = None
        if resume is not None:
            session_id = store.resolve_session_id(resume)
            resumed = store.get_session(session_id)
            workspace = resumed.validate_workspace(workspace)
            stored = journal.stored_snapshot(store, session_id)
            if stored is None and resumed.last_seq:  # it can never resume: say so before any model is needed
                raise journal.snapshot_missing(store, session_id)
            with ModelManager(settings) as manager:
                if stored is not None:
                    installed = _session_model(manager, session_id, stored.model_reference, model)
                else:
                    installed = manager.get(model) if model else manager.default()
        recall = RECALL_SOURCE in stored.context if stored is not None else not no_recall
        tools = registered_tools(pm) if recall else without_memory_tools(registered_tools(pm))
        binding_settings = settings if stored is None else \
            settings.model_copy(update={"model_max_context_tokens": stored.context_size})
        _, binding = bind_model(pm, installed, binding_settings, stop=stop.event)
        try:
            if not callable(getattr(binding, "stream_chat", None)):
                raise typer.BadParameter(f"model {installed.name!r} has a binding without stream_chat; chat needs one")
            asking = StatusLine(TrackedOutput(sys.stdout), sys.stdout.isatty())
            if installed.server is not None:  # its server is asked what it serves and how it calls tools: maybe long
                asking.show(f"asking the model server at {installed.server.url} what it supports (Ctrl-C stops)")
            try:
                if stored is None:
                    if resume is not None:  # a Session without a snapshot (and without history): it gets one now
                        requested = requested_policy(policies, policy_name, settings.chat_policy)
                    policy, why = new_chat_policy(policies, requested, installed, binding)
                    snapshot = build_snapshot(binding, tools, model_reference=installed.reference,
                                              model_snapshot_id=installed.snapshot_id, system_prompt=SYSTEM_PROMPT,
                                              context=CONTEXT + ((RECALL_SOURCE,) if recall else ()), policy=policy)
                else:
                    policy, why = resumed_chat_policy(policies, policy_name, session_id, stored)
                    snapshot = _resumed_snapshot(stored, binding, tools, installed, policy)
                probe = getattr(binding, "tool_calling", None) if policy.answer_chars is None else None
                line = policy_line(policy, why, snapshot, probe() if callable(probe) else None)
            finally:
                asking.clear()
            if stop.requested is not None:
                raise GenerationInterrupted("once the model was loaded")
            try:
                return asyncio.run(_main(store, workspace, binding, tools, snapshot, session_id, installed,
                                         new_workspace, policies, line, stop, prompt))
            except WorkspaceReplacedError as exc:
                raise WorkspaceReplacedError(str(exc).replace(REMEMBER_ADVICE, "`emelex chat --new-workspace`")) \
                    from None
        finally:
            binding.close()
    finally:
        store.close()
