"""Simple workspace tasks done through the real `emelex chat` process on the embedded default model.

Each task gets a fresh temporary workspace with its own files and one line
typed into a new `emelex chat` (SmolLM2-135M-Instruct through llama.cpp,
every setting at its default), driven through pipes the way a user at the
terminal would: the task is typed at the prompt, every approval prompt is
answered (`approve`: a `write_file` call is approved, a `run_command` call
only when every command of it is one of a few harmless programs, anything
else denied), and the turn ends when the prompt returns. The task passes
when its criterion, fixed in `TASKS` below before any run, holds of the
answer the Session recorded (or of the file the task asked for). Every
turn is read back from the Session's transcript: whether it ended with an
answer, how many tool calls it ran, and whether any ran a call identical to
one that already ran in the same turn.

Targets: at least 8 of the 12 tasks pass, no turn ends without an answer,
no identical call runs twice in a turn, and the mean time per task (from
typing the task to the prompt's return; the model load excluded) is under
30 s on the 2-core machine. Writes its section of benchmarks/RESULTS.md
(with the per-task table) and exits 1 on a missed target. The machine is
shared, so the times are noisy.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import met, publish, verdict  # noqa: E402
from emelex_memory import DefaultModelUnavailableError, MemoryStore  # noqa: E402
from emelex_workers.models import ModelManager, default_model_file  # noqa: E402
from emelex_workers.settings import WorkerSettings

SECTIONS = ("chat-tasks",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_workers/agent",
    "emelex_workers/cli/chat.py",
    "emelex_workers/cli/chat_show.py",
    "plugins/emelex_tools",
    "plugins/emelex_llamacpp",
)
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
TARGET_PASSED = 8
TARGET_MEAN_S = 30.0
START_DEADLINE_S = 180.0  # the chat's start (the model load, the first llama.cpp probe) at most
TURN_DEADLINE_S = 300.0  # one task's turn at most; past it the turn is interrupted and the task fails
ANSWER_CHARS = 90  # of each answer in the table
HARMLESS = frozenset({"ls", "cat", "wc", "head", "tail", "grep", "echo", "pwd", "find", "sort", "uniq", "du",
                      "stat", "file", "cut", "tr", "date", "python3", "python"})
EFFECTFUL = ("write_file", "run_command")  # the built-in tools that may change what a later call sees
UNSAFE = re.compile(r"[;&`<>$]|\brm\b|-delete\b|-exec\b|(^|\s)-c\b|\.\.")


@dataclass(frozen=True)
class Task:
    """One task: its `name`, the `files` of its fresh workspace (path -> text; a path ending in "/" is an empty
    directory), the line typed, and `passes(answer, workspace)`, the criterion fixed before any run."""

    name: str
    kind: str
    files: dict[str, str]
    prompt: str
    criterion: str
    passes: Callable[[str, Path], bool]


def says(*needles: str) -> Callable[[str, Path], bool]:
    """The answer contains every one of `needles` (case-insensitive)."""
    return lambda answer, _workspace: all(n.lower() in answer.lower() for n in needles)


def says_number(number: int) -> Callable[[str, Path], bool]:
    """The answer contains `number` as a whole number (digits), not only as part of a longer one."""
    return lambda answer, _workspace: re.search(rf"(?<![\d.]){number}(?![\d]|\.\d)", answer) is not None


def wrote(path: str, text: str) -> Callable[[str, Path], bool]:
    """The workspace has a regular file `path` whose text contains `text` (case-insensitive)."""
    def check(_answer: str, workspace: Path) -> bool:
        target = workspace / path
        return target.is_file() and not target.is_symlink() and text.lower() in target.read_text(
            errors="replace").lower()
    return check


SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16"><circle cx="8" cy="8" r="7"/></svg>\n'
TASKS = (
    Task("list", "list what is there",
         {"notes.txt": "Buy milk.\n", "todo.md": "- ship it\n", "src/main.py": "print('hi')\n"},
         "What files are in this workspace?", "names notes.txt, todo.md and main.py",
         says("notes.txt", "todo.md", "main.py")),
    Task("ini-port", "report a config value",
         {"config.ini": "[server]\nhost = 0.0.0.0\nport = 8421\n\n[log]\nlevel = info\n", "README.md": "# App\n"},
         "What port does config.ini set?", "says 8421", says_number(8421)),
    Task("json-version", "report a config value",
         {"settings.json": json.dumps({"name": "orbit", "version": "2.7.1", "debug": False}, indent=2) + "\n",
          "main.py": "import json\n"},
         "What version is set in settings.json?", "says 2.7.1", says("2.7.1")),
    Task("toml-nested", "report a config value",
         {"config/db.toml": '[database]\nname = "inventory_prod"\nuser = "app"\n', "config/app.toml": 'debug = true\n',
          "run.sh": "echo run\n"},
         "What is the database name in config/db.toml?", "says inventory_prod", says("inventory_prod")),
    Task("defines", "find which file defines a function",
         {"src/geometry.py": "import math\n\n\ndef area_of_circle(r):\n    return math.pi * r * r\n",
          "src/text.py": "def shout(s):\n    return s.upper()\n", "src/__init__.py": ""},
         "Which file defines the function area_of_circle?", "names geometry.py", says("geometry.py")),
    Task("search-word", "find which file mentions a word",
         {"recipes/pizza.txt": "Dough, tomato, cheese, ham and pineapple.\n",
          "recipes/salad.txt": "Lettuce, tomato, cucumber.\n", "shopping.txt": "flour\n"},
         "Which file mentions pineapple?", "names pizza.txt", says("pizza.txt")),
    Task("read-motd", "report what a file says",
         {"motd.txt": "Deploy freeze starts Friday at noon.\n", "app.py": "print('app')\n"},
         "What does motd.txt say?", "says Friday", says("friday")),
    Task("file-size", "report a file's size",
         {"logo.svg": SVG, "index.html": "<html></html>\n"},
         "How many bytes is logo.svg?", f"says {len(SVG.encode())}", says_number(len(SVG.encode()))),
    Task("count-lines", "count lines",
         {"data.csv": "id,name\n1,ada\n2,bob\n3,cy\n4,dee\n5,eve\n6,fay\n", "notes.txt": "csv of people\n"},
         "How many lines does data.csv have?", "says 7", says_number(7)),
    Task("create-file", "create a small file",
         {"README.md": "# Scratch\n"},
         "Create a file hello.txt containing the text: Hello, world!", "hello.txt holds 'Hello, world'",
         wrote("hello.txt", "hello, world")),
    Task("create-in-dir", "create a small file",
         {"docs/index.md": "# Docs\n", "setup.cfg": "[metadata]\nname = x\n"},
         "Write a file docs/notes.md with the line: meeting at noon", "docs/notes.md holds 'meeting at noon'",
         wrote("docs/notes.md", "meeting at noon")),
    Task("run-script", "run a command and report its output",
         {"greet.py": "print('launch code', 5000 + 519)\n", "README.md": "# Greeter\n"},
         "Run the command python3 greet.py and tell me what it prints.", "says 5519", says_number(5519)),
)


def approve(tool: str, arguments: dict) -> str:
    """The answer a careful user gives at the approval prompt: "y" for `write_file`, "y" for `run_command` when
    every command of its pipeline is one of `HARMLESS` (no redirection, substitution, `-c`, `rm` or `..`), else
    "n"."""
    if tool == "write_file":
        return "y"
    if tool != "run_command":
        return "n"
    command = str(arguments.get("command", ""))
    if UNSAFE.search(command):
        return "n"
    try:
        stages = [shlex.split(stage) for stage in command.split("|")]
    except ValueError:
        return "n"
    return "y" if stages and all(stage and stage[0] in HARMLESS for stage in stages) else "n"


class Chat:
    """One `emelex chat` process, read without blocking: `wait_for` a pattern with a deadline, `type` a line."""

    def __init__(self, home: Path, workspace: Path) -> None:
        env = {**os.environ, "EMELEX_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen([*EMELEX, "chat", "--workspace", str(workspace)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.output = ""
        self.read_to = 0

    def wait_for(self, patterns: dict[str, re.Pattern], deadline: float) -> tuple[str | None, re.Match | None]:
        """Read until one of `patterns` matches the output after what was consumed; (its name, the match), or
        (None, None) at the deadline or at the end of output."""
        while True:
            for name, pattern in patterns.items():
                match = pattern.search(self.output, self.read_to)
                if match:
                    self.read_to = match.end()
                    return name, match
            left = deadline - time.monotonic()
            if left <= 0:
                return None, None
            ready, _, _ = select.select([self.process.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 65536)
                if not chunk:
                    return None, None
                self.output += chunk.decode("utf-8", "replace")

    def type(self, line: str) -> None:
        """Type one line."""
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def end(self) -> int:
        """Type /exit and close the input; the exit status (killed with its process group after 60 s)."""
        try:
            self.type("/exit")
            self.process.stdin.close()
        except BrokenPipeError:
            pass
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(timeout=60)


PROMPT = re.compile(r"(?:^|\n)> $")
APPROVAL = re.compile(r"([^\n]*)\napprove this call\? [^\n]*: $")  # the call's line, then the question
CALL = re.compile(r"(\w+) (\{.*)")  # "tool {arguments}", the last one on the call's line
SESSION = re.compile(r"session ([0-9a-f-]{36})")


def asked_call(line: str) -> tuple[str, dict]:
    """The tool and arguments of the call an approval prompt asks about, from the line printed before it (where
    the proposed call's own "-> tool {...}" may precede it without a line break): the last "tool {" on the line
    whose rest is JSON; arguments {} when none is (cut in the preview)."""
    tool = ""
    for start in reversed([m.start() for m in re.finditer(r"(?<!\w)\w+ \{", line)]):
        name, rest = CALL.match(line, start).groups()
        tool = tool or name
        try:
            return name, json.loads(rest)
        except ValueError:
            continue
    return tool, {}


def turn_record(home: Path, session: str) -> dict:
    """What the Session's transcript says of its one turn: the answer (or None), how it ended, the calls that ran
    and how many of them repeated an identical call that had already run in the turn since the last call of an
    `EFFECTFUL` tool ran (reading a file again after writing it is no repeat)."""
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        events = list(store.replay(session).events)
    answer = next((e.payload.get("text") for e in events if e.kind == "assistant"), None)
    failed = next((e.payload for e in events if e.kind == "turn_failed"), None)
    ran: list[str] = []  # the calls run since the last effectful one
    arguments: dict[str, str] = {}
    runs = repeats = 0
    for event in events:
        if event.kind == "tool_calls":
            for call in event.payload.get("calls", []):
                arguments[call["call_id"]] = json.dumps([call["tool"], call["arguments"]], sort_keys=True)
        elif event.kind == "tool_result" and event.payload.get("outcome") == "ok":
            key = arguments.get(event.payload.get("call_id"), "")
            repeats += key in ran
            runs += 1
            ran.append(key)
            if event.payload.get("tool") in EFFECTFUL:
                ran = []  # what ran before may read differently now: a call after it is a new one
    forced = next((e.payload["forced"] for e in events if e.kind == "audit" and e.payload.get("forced")), None)
    return {"answer": answer, "ended": "answer" if answer is not None else (failed or {}).get("reason", "none"),
            "ran": runs, "repeats": repeats, "forced": forced,
            "diagnostic": (failed or {}).get("diagnostic", "")}


def run_task(home: Path, task: Task, root: Path) -> dict:
    """Run `task` in a fresh workspace under `root` through a new chat; its row of the results table."""
    workspace = root / task.name
    workspace.mkdir()
    for path, text in task.files.items():
        target = workspace / path
        if path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    chat = Chat(home, workspace)
    row = {"task": task.name, "kind": task.kind, "criterion": task.criterion, "approved": 0, "denied": 0}
    try:
        started, _ = chat.wait_for({"prompt": PROMPT}, time.monotonic() + START_DEADLINE_S)
        session = SESSION.search(chat.output)
        if started is None or session is None:
            raise RuntimeError(f"the chat did not start: {chat.output[-500:]!r}")
        begin = time.monotonic()
        chat.type(task.prompt)
        deadline = begin + TURN_DEADLINE_S
        while True:
            seen, match = chat.wait_for({"prompt": PROMPT, "approval": APPROVAL}, deadline)
            if seen == "approval":
                tool, arguments = asked_call(match.group(1))
                decision = approve(tool, arguments)
                row["approved" if decision == "y" else "denied"] += 1
                chat.type(decision)
                continue
            break
        row["seconds"] = time.monotonic() - begin
        row["timed_out"] = seen is None
        if seen is None:
            chat.process.send_signal(signal.SIGINT)
            chat.wait_for({"prompt": PROMPT}, time.monotonic() + 60)
    finally:
        status = chat.end()
    row["exit"] = status
    row.update(turn_record(home, session.group(1)))
    row["passed"] = bool(task.passes(row["answer"] or "", workspace))
    return row


def _cell(text: str) -> str:
    text = " ".join(str(text).split())
    if len(text) > ANSWER_CHARS:
        text = text[:ANSWER_CHARS - 1] + "\u2026"
    return text.replace("|", "\\|").replace("`", "'")


def render(figures: dict) -> str:
    """The `chat-tasks` section of the recorded `figures`."""
    rows = figures["tasks"]
    passed = sum(r["passed"] for r in rows)
    unanswered = sum(r["ended"] != "answer" for r in rows)
    repeats = sum(r["repeats"] for r in rows)
    mean = statistics.fmean(r["seconds"] for r in rows)
    table = ["| task | kind | criterion | passed | time | calls run | approvals y/n | ended | answer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ended = r["ended"] + (f" (forced: {r['forced']})" if r.get("forced") else "")
        shown = r["answer"] if r["answer"] is not None else r.get("diagnostic", "")
        table.append(f"| {r['task']} | {r['kind']} | {_cell(r['criterion'])} | {'yes' if r['passed'] else 'no'} | "
                     f"{r['seconds']:.1f} s | {r['ran']} | {r['approved']}/{r['denied']} | {ended} | "
                     f"{_cell(shown)} |")
    return "\n".join([
        "## Chat tasks (`bench_chat_tasks.py`)",
        "",
        f"Measured {figures['measured']} on {figures['model']}, every chat setting at its default, through the "
        "real `emelex chat` process (one new Session per task, in a fresh temporary workspace; the task typed at "
        "the prompt; write_file calls approved, run_command calls approved only for a few harmless programs). "
        "A task passes when its criterion, fixed before the first run, holds of the recorded answer (or of the "
        "file asked for). Time: from typing the task to the prompt's return (the model load excluded), on a "
        "shared 2-core machine, so noisy.",
        "",
        f"- tasks passed: {passed} of {len(rows)} ({verdict(passed, '>=', TARGET_PASSED)})",
        f"- turns that ended without an answer: {unanswered} ({verdict(unanswered, '<=', 0)})",
        f"- identical calls run again in a turn: {repeats} ({verdict(repeats, '<=', 0)})",
        f"- mean time per task: {mean:.1f} s ({verdict(mean, '<', TARGET_MEAN_S)})",
        "",
        *table,
        "",
    ])


def main() -> int:
    """Run every task, print each row, write the section; 1 when a target is missed (or the model is missing)."""
    try:
        default_model_file()
    except DefaultModelUnavailableError as exc:
        print(f"skipped: {exc}")
        return 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="emelex-chat-tasks-") as tmp:
        home, root = Path(tmp) / "home", Path(tmp) / "workspaces"
        root.mkdir()
        with ModelManager(WorkerSettings(home=home)) as manager:
            model = manager.install_default(link=True)
        for task in TASKS:
            row = run_task(home, task, root)
            rows.append(row)
            print(f"{task.name:<14} {'PASS' if row['passed'] else 'fail'} {row['seconds']:6.1f} s  ran {row['ran']} "
                  f"repeats {row['repeats']} ended {row['ended']}: {(row['answer'] or row['diagnostic'])[:100]!r}",
                  flush=True)
    figures = {"model": model.name, "tasks": rows}
    text = publish("chat-tasks", render, figures)
    print(text)
    passed = sum(r["passed"] for r in rows)
    mean = statistics.fmean(r["seconds"] for r in rows)
    unanswered = sum(r["ended"] != "answer" for r in rows)
    repeats = sum(r["repeats"] for r in rows)
    ok = (met(passed, ">=", TARGET_PASSED) and unanswered == 0 and repeats == 0 and met(mean, "<", TARGET_MEAN_S))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
