"""The chat part of `make demo`: `emelex chat` on the real default model, driven through its standard input.

First a task, typed as a user would: the demo writes a small project into
the workspace (`config.toml`, `README.md`, `app.py`) and asks "What is the
port in config.toml?" with every tool enabled, denying any call that asks
for approval (the task only reads). The turn must end with an answer that
names the port (read from the Session's transcript, not the screen); when
it does not, the demo goes on and `main` returns the failure, so `make
demo` exits non-zero. Then a second chat asks the model to run a slow
command with `run_command` (the only enabled tool, asked for as a user would:
"Run `sleep 20; echo done`") and approves it; once the
journal shows the call `started`, the chat process is killed with SIGKILL; the
command outlives it. Then: `emelex chat --resume` fails closed naming the
command that still runs, `emelex memory sessions recover` refuses too and
changes nothing, `--stop-running --accept-unknown-effects` stops the command
and records the unknown effect, and a resumed chat runs a turn with an
approved tool call to its answer.

A second chat (`recalling_chat`) follows: `emelex memory work` distills
the first chat's Session, then a new chat Session, asked about the
project's conventions, recalls at its first turn the Knowledge the
distillations stored, says how many notes, and `/memory` shows each with
its source.

The driver reacts to what the chat prints: it approves only the command it
asked for (anything else is denied and said so), and every wait is bounded,
so an unexpected proposal ends the demo with an honest note, never a hang.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from emelex_memory import MemoryStore

from ..settings import WorkerSettings
from emelex_memory.agent.journal import read_journal

PROMPT, APPROVAL = "\n> ", "approve this call? [y]es / [n]o / [a]bort the turn: "
SLOW, FAST = "sleep 20; echo done", "echo hello from the tool"
QUESTION = "What did the echo command print?"  # asked with no tool enabled, so the model can only answer
RECALL_QUESTION = "Which formatter do we use, and what is the default branch?"  # what the closed Session said
EVERY_TOOL = ("read_file", "list_dir", "search_text", "write_file", "edit_file", "run_command", "recall", "remember")
ONLY_RUN_COMMAND = [f"/tools disable {name}" for name in EVERY_TOOL if name != "run_command"]
PROJECT = {
    "config.toml": '[server]\nhost = "127.0.0.1"\nport = 5174\n\n[log]\nlevel = "info"\n',
    "README.md": "# notes-service\n\nA small web service for notes. Settings live in config.toml.\n",
    "app.py": 'import tomllib\n\n\ndef main():\n    with open("config.toml", "rb") as f:\n'
              '        print(tomllib.load(f)["server"])\n',
}
TASK, TASK_ANSWER = "What is the port in config.toml?", "5174"  # not the worked example's 8080
TURN_WAIT_S = 600  # a whole turn: up to chain limit + 1 rounds of 512 tokens, and their tool calls, on two busy cores
ROUND_WAIT_S = 120  # a model round on two busy cores, with the model load of a fresh process
START_WAIT_S = 30
LEASE_TTL_S = 10  # the chats' Session lease lifetime: a killed chat's lease expires this long after its last renewal
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]


def ask_for(command: str) -> str:
    """The user's request to run `command`, as a user types it (protocol "emelex-tools/3" offers the quoted command
    among the spans of the request; see docs/agent.md, Quoted answers)."""
    return f"Run `{command}`"


class DrivenChat:
    """One `emelex chat` subprocess: its output is echoed as it arrives and can be waited for."""

    def __init__(self, env: dict[str, str], workspace: Path, *args: str) -> None:
        """Start `emelex chat --workspace WORKSPACE ARGS` with `env`."""
        print(f"\n$ emelex chat {' '.join(args)}", flush=True)
        self.process = subprocess.Popen([*EMELEX, "chat", "--workspace", str(workspace), *args], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = ""
        self._seen = 0
        self._ended = False
        self._changed = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        while piece := os.read(self.process.stdout.fileno(), 4096):
            text = piece.decode("utf-8", "replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            with self._changed:
                self.output += text
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def expect(self, *marks: str, limit_s: float) -> str | None:
        """Wait (at most `limit_s`) for the first of `marks` in output not yet consumed; consume up to it and
        return it, or None on timeout or when the chat ended first."""
        deadline = time.monotonic() + limit_s
        with self._changed:
            while True:
                found = [(self.output.find(m, self._seen), m) for m in marks]
                found = [(at, m) for at, m in found if at >= 0]
                if found:
                    at, mark = min(found)
                    self._seen = at + len(mark)
                    return mark
                left = deadline - time.monotonic()
                if left <= 0 or self._ended:
                    return None
                self._changed.wait(min(left, 0.5))

    def consumed(self) -> str:
        """Everything the chat printed up to the last mark `expect` returned."""
        return self.output[:self._seen]

    def send(self, line: str) -> None:
        """Type `line` (it is echoed, since a pipe does not echo)."""
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        assert self.process.stdin is not None
        self.process.stdin.write((line + "\n").encode())
        self.process.stdin.flush()

    def finish(self, limit_s: float = 60) -> int:
        """Close its input and wait (bounded) for its exit status; kill it if it does not end."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        try:
            return self.process.wait(limit_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def note(text: str) -> None:
    """A line of the demo's own commentary."""
    print(f"\n[demo] {text}", flush=True)


def proposed_command(chat: DrivenChat) -> str | None:
    """The command of the last `run_command {...}` line before the approval prompt."""
    calls = re.findall(r"run_command (\{.*\})\n", chat.consumed())
    try:
        return json.loads(calls[-1]).get("command") if calls else None
    except ValueError:
        return None


def request(chat: DrivenChat, command: str, *, whole_turn: bool) -> bool:
    """Ask for `command` and answer the approval prompts: approve it, deny any other command; once it ran, abort
    the turn at the next proposal (SmolLM2-135M rarely stops calling tools on its own). With `whole_turn`, go on
    until the turn ends; else return as soon as the call is approved. True when it was approved; False (with a
    note) when the turn ended without it or the chat stopped answering."""
    chat.send(ask_for(command))
    approved = False
    while True:
        mark = chat.expect(APPROVAL, PROMPT, limit_s=ROUND_WAIT_S)
        if mark is None:
            note(f"the chat gave no prompt within {ROUND_WAIT_S} s")
            return False
        if mark == PROMPT:
            if not approved:
                note(f"the model ended the turn without proposing `{command}`; SmolLM2-135M is small")
            return approved
        proposed = proposed_command(chat)
        if approved:
            note(f"the model proposes another call ({proposed!r}); the demo aborts the turn")
            chat.send("a")
        elif proposed == command:
            chat.send("y")
            approved = True
            if not whole_turn:
                return True
        else:
            note(f"the model proposed {proposed!r}, not the command asked for; the demo denies it")
            chat.send("n")


def wait_started(settings: WorkerSettings, session_id: str) -> bool:
    """Poll the Session's journal (at most `START_WAIT_S`) until a call is `started` with its command's process
    recorded (`run_command` runs the command only once it is)."""
    deadline = time.monotonic() + START_WAIT_S
    with MemoryStore.open(settings) as store:
        while time.monotonic() < deadline:
            turn = read_journal(store, session_id)
            if turn is not None and any(c.state == "started" and c.processes for c in turn.calls):
                return True
            time.sleep(0.2)
    return False


def run_cli(env: dict[str, str], *args: str) -> int:
    """Run `emelex ARGS` in a subprocess, its output shown; its exit status."""
    print(f"\n$ emelex {' '.join(args)}", flush=True)
    code = subprocess.run([*EMELEX, *args], env=env, stderr=subprocess.STDOUT).returncode
    print(f"(exit status {code})", flush=True)
    return code


def killed_tool(env: dict[str, str], workspace: Path, settings: WorkerSettings) -> str | None:
    """A chat whose approved slow command is killed mid-run; the Session ID, or None (with a note) when the model
    did not propose it."""
    chat = DrivenChat(env, workspace)
    if chat.expect(PROMPT, limit_s=ROUND_WAIT_S) is None:
        note("the chat did not start")
        chat.finish()
        return None
    session_id = re.search(r"session (\S+);", chat.output).group(1)
    for line in ONLY_RUN_COMMAND:
        chat.send(line)
        chat.expect(PROMPT, limit_s=30)
    if not request(chat, SLOW, whole_turn=False):
        chat.send("/exit")
        chat.finish()
        return None
    if not wait_started(settings, session_id):
        note("the journal never showed the call started with its command running")
        chat.finish()
        return None
    chat.process.send_signal(signal.SIGKILL)
    chat.finish()
    note(f"the journal showed the call started and its command's process; the chat process was killed with SIGKILL "
         f"while `{SLOW}` ran. "
         f"Waiting {LEASE_TTL_S + 1} s for its Session lease (TTL {LEASE_TTL_S} s) to expire")
    time.sleep(LEASE_TTL_S + 1)
    return session_id


def recover_and_resume(env: dict[str, str], workspace: Path, session_id: str) -> None:
    """The fail-closed resume and recovery while the killed chat's command still runs, the recovery that stops it
    and accepts its unknown effect, then a resumed chat with a tool call."""
    run_cli(env, "memory", "sessions", "show", session_id)
    chat = DrivenChat(env, workspace, "--resume", session_id)
    note(f"the resume failed closed (exit status {chat.finish()})")
    run_cli(env, "memory", "sessions", "recover", session_id)
    run_cli(env, "memory", "sessions", "recover", session_id, "--stop-running", "--accept-unknown-effects")
    chat = DrivenChat(env, workspace, "--resume", session_id)
    if chat.expect(PROMPT, limit_s=ROUND_WAIT_S) is None:
        note("the resumed chat did not start")
        chat.finish()
        return
    for line in ONLY_RUN_COMMAND:
        chat.send(line)
        chat.expect(PROMPT, limit_s=30)
    if request(chat, FAST, whole_turn=True):
        chat.send("/tools disable run_command")
        chat.expect(PROMPT, limit_s=30)
        chat.send(QUESTION)
        if chat.expect(PROMPT, limit_s=ROUND_WAIT_S) is None:
            note(f"no answer within {ROUND_WAIT_S} s")
    chat.send("/exit")
    chat.finish()


def recalling_chat(env: dict[str, str], workspace: Path) -> None:
    """The second chat: distill the earlier chat's Session, then a new Session whose first turn recalls the
    workspace's Knowledge (every tool disabled, so the model can only answer); the chat says how many notes it
    recalled and `/memory` lists them with their sources."""
    run_cli(env, "memory", "work")
    chat = DrivenChat(env, workspace)
    if chat.expect(PROMPT, limit_s=ROUND_WAIT_S) is None:
        note("the second chat did not start")
        chat.finish()
        return
    for name in EVERY_TOOL:
        chat.send(f"/tools disable {name}")
        chat.expect(PROMPT, limit_s=30)
    chat.send(RECALL_QUESTION)
    recalled = ("[recalled ", "[no notes recalled")
    mark = chat.expect(*recalled, limit_s=ROUND_WAIT_S)
    if mark is None:
        note(f"the first turn did not end within {ROUND_WAIT_S} s; the demo interrupts it (Ctrl-C): the notes were "
             "recalled before its first round")
        chat.process.send_signal(signal.SIGINT)
        mark = chat.expect(*recalled, limit_s=30)
    if mark is None:
        note("the chat did not say what it recalled")
    else:
        chat.expect(PROMPT, limit_s=30)
        note("that turn's model saw these notes before its first round, recorded in the Session's transcript; "
             "a resume replays them as they were")
        chat.send("/memory")
        chat.expect(PROMPT, limit_s=30)
    chat.send("/exit")
    chat.finish()


def turn_ending(settings: WorkerSettings, session_id: str) -> tuple[str | None, str]:
    """How the Session's last turn ended, from its transcript: (the answer, "") or (None, why there is none)."""
    events, after, done = [], 0, False
    with MemoryStore.open(settings) as store:
        while not done:
            page = store.replay(session_id, after)
            events, after, done = events + page.events, page.next_cursor, page.done
    last = [e for e in events if e.kind in ("user", "assistant", "turn_failed")][-1:]
    if not last or last[0].kind == "user":
        return None, "the turn never ended"
    if last[0].kind == "turn_failed":
        return None, f"the turn ended without an answer: {last[0].payload.get('diagnostic', last[0].payload)}"
    return last[0].payload["text"], ""


def task(env: dict[str, str], workspace: Path, settings: WorkerSettings) -> str | None:
    """Ask `TASK` about the project written into `workspace`, denying every call that asks for approval; None
    when the turn ended (a model that answers wrongly or not at all is a `NOT DONE` note, as the model's quality is
    not the chat's failure), else what went wrong with the chat itself."""
    for name, text in PROJECT.items():
        (workspace / name).write_text(text)
    note(f"a small project is in the workspace ({', '.join(PROJECT)}); a user asks about it")
    chat = DrivenChat(env, workspace)
    if chat.expect(PROMPT, limit_s=ROUND_WAIT_S) is None:
        chat.finish()
        return "the chat did not start"
    session_id = re.search(r"session (\S+);", chat.output).group(1)
    chat.send(TASK)
    while (mark := chat.expect(APPROVAL, PROMPT, limit_s=TURN_WAIT_S)) == APPROVAL:
        note("the task only reads files: the demo denies a call that asks for approval")
        chat.send("n")
    chat.send("/exit")
    chat.finish()
    if mark is None:
        return f"the turn did not end within {TURN_WAIT_S} s"
    answer, why = turn_ending(settings, session_id)
    if answer is None or TASK_ANSWER not in answer:
        miss = why if answer is None else f"the answer {answer!r} does not name the port, {TASK_ANSWER}"
        note(f"NOT DONE: {miss}. The chat worked, but the embedded 135M model did not finish the task this time (how "
             "often it does on simple tasks: benchmarks/RESULTS.md, \"Chat tasks\")")
        return None
    note(f"the chat answered {answer!r}: config.toml sets port {TASK_ANSWER}")
    return None


def main(workspace: Path, settings: WorkerSettings) -> str | None:
    """Run the chat part of the demo in `workspace` over the demo store of `settings`; None when the task chat
    ran to the end of its turn, else what went wrong (the recovery part runs either way)."""
    env = {**os.environ, "EMELEX_HOME": str(settings.home_dir),
           "EMELEX_MODEL_MAX_CONTEXT_TOKENS": str(settings.model_max_context_tokens),
           "EMELEX_SESSION_LEASE_TTL_S": str(LEASE_TTL_S)}
    failed = task(env, workspace, settings)
    if failed is not None:
        note(f"FAILED: {failed}")
    session_id = killed_tool(env, workspace, settings)
    if session_id is not None:
        recover_and_resume(env, workspace, session_id)
    recalling_chat(env, workspace)
    return failed
