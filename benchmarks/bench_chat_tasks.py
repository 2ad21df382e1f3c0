"""Workspace tasks worded as people type, done through the real `emelex chat` process on a pseudo-terminal, on the
embedded default model, under each of the two built-in turn policies side by side: "guided" (the default for this
model) and "open".

Three small realistic repositories (a Python package with tests, a Node
project, a folder of notes) hold the files; each task gets a fresh copy of
one of them and a new `emelex chat` (SmolLM2-135M-Instruct through
llama.cpp, every setting at its default but `--policy`) on a pseudo-terminal
whose screen a terminal emulator (`pyte`) renders, as a person at a terminal
sees it. The task's lines are typed at the prompt one after another (a
follow-up only once the previous turn ended); every approval prompt is
answered as a careful user would (a write or edit of a workspace file is
approved; a command only when every program of it is one of a few harmless
ones or the project's own runners; anything else denied), the call read from
the Session's tool journal. A task passes when its criterion, fixed in `TASKS`
below before any run, holds: a question of its answers, a change of the files
afterwards, a command of what ran (the command and its output, from the
transcript).

The tasks are split in two halves fixed here before any run (`Task.half`):
"tune" (rules may be tuned against it) and "held" (never looked at while
tuning). Both are reported separately.

Also counted over every task: writes that lost content the approval did not
show (a line of a file present before the task, gone afterwards, that no
approval screen showed as a removed "-" line); answers with nothing read (a
turn that ran no tool and whose answer states a fact, a token with a digit,
a dot or an underscore in it, found neither in what the Session read nor in
what was typed); answers erased (the answer's first line not on the rendered
screen once its turn ended).

Targets, of the guided policy (the one this model runs by default): at least
60% of the held half passes, 0 writes losing content the approval did not
show, 0 answers with nothing read, 0 answers erased. The open policy is
measured beside it (each policy in a process of its own, the two at the same
time: the targets are counts, not times; a turn of the open policy is cut
after 60 s, of the guided after 180 s), with no target. Writes its section of benchmarks/RESULTS.md (with the
per-task table) and exits 1 on a missed target. The machine is shared, so the
times are noisy.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shlex
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import met, publish, verdict  # noqa: E402
from emelex_memory import DefaultModelUnavailableError, MemoryStore  # noqa: E402
from emelex_memory.agent.journal import read_journal  # noqa: E402
from emelex_workers.models import ModelManager, default_model_file  # noqa: E402
from emelex_workers.settings import WorkerSettings

SECTIONS = ("chat-tasks",)
POLICIES = ("guided", "open")
HALVES = ("tune", "held")
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_workers/agent",
    "emelex_workers/cli/chat.py",
    "emelex_workers/cli/chat_show.py",
    "emelex_workers/cli/chat_policy.py",
    "emelex_workers/cli/chat_sessions.py",
    "emelex_workers/host/policies.py",
    "emelex_workers/host/notes.py",
    "plugins/emelex_tools",
    "plugins/emelex_llamacpp",
)
EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
TARGET_HELD_SHARE = 0.6  # of the held half, under the guided policy
START_DEADLINE_S = 180.0  # the chat's start (the model load, the first llama.cpp probe) at most
TURN_DEADLINE_S = {"guided": 180.0, "open": 60.0}  # one turn at most; past it the turn is interrupted (task fails)
COLUMNS, ROWS = 200, 2000  # the pseudo-terminal: wide and tall enough that a task's screen never scrolls away
ANSWER_CHARS = 90  # of each answer in the table
HARMLESS = frozenset({"ls", "cat", "wc", "head", "tail", "grep", "echo", "pwd", "find", "sort", "uniq", "du",
                      "stat", "file", "cut", "tr", "date", "python3", "python", "node", "npm", "make", "pytest"})
WRITERS = ("write_file", "edit_file")  # the built-in tools that change a workspace file
UNSAFE = re.compile(r"[;&`<>$]|\brm\b|-delete\b|-exec\b|(^|\s)-c\b|\.\.|\binstall\b|\bpublish\b")


# The three repositories. Each task copies one of them into a fresh workspace.
PYPKG = {
    "pyproject.toml": '[project]\nname = "tidy-csv"\nversion = "0.3.1"\ndescription = "Clean up messy CSV files"\n'
                      'requires-python = ">=3.9"\ndependencies = ["click>=8.0"]\nlicense = {text = "MIT"}\n\n'
                      '[project.scripts]\ntidy-csv = "tidy_csv.cli:main"\n',
    "README.md": "# tidy-csv\n\nClean up messy CSV files: trims cells, drops empty rows, normalizes headers.\n\n"
                 "## Usage\n\n    tidy-csv input.csv > clean.csv\n\n## Development\n\n    make test\n",
    "Makefile": "test:\n\tpython3 -m unittest discover -s tests -v\n\nlint:\n\tpython3 -m pyflakes src\n",
    "CHANGELOG.md": "# Changelog\n\n## 0.3.1\n- fix quoting of cells with commas\n\n## 0.3.0\n- first release\n",
    "LICENSE": "MIT License\n\nCopyright (c) 2026 Dana Okafor\n",
    ".gitignore": "__pycache__/\n*.egg-info/\ndist/\n",
    "src/tidy_csv/__init__.py": '"""tidy-csv: clean up messy CSV files."""\n\n__version__ = "0.3.1"\n',
    "src/tidy_csv/cleaner.py": 'DEFAULT_DELIMITER = ";"\n\n\ndef strip_cells(row):\n    return [cell.strip() for '
                               'cell in row]\n\n\ndef drop_empty_rows(rows):\n    return [row for row in rows if '
                               'any(cell.strip() for cell in row)]\n',
    "src/tidy_csv/utils.py": 'MAX_COLUMNS = 256\n\n\ndef normalize_header(name):\n    return name.strip().lower()'
                             '.replace(" ", "_")\n',
    "src/tidy_csv/cli.py": "import sys\n\nfrom .cleaner import drop_empty_rows, strip_cells\n\n\ndef main():\n"
                           "    print('tidy-csv', sys.argv[1:])\n",
    "tests/test_cleaner.py": "import sys\nimport unittest\nfrom pathlib import Path\n\nsys.path.insert(0, "
                             "str(Path(__file__).resolve().parent.parent / 'src'))\n\nfrom tidy_csv.cleaner import "
                             "drop_empty_rows, strip_cells  # noqa: E402\nfrom tidy_csv.utils import normalize_header"
                             "  # noqa: E402\n\n\nclass CleanerTest(unittest.TestCase):\n    def test_strip(self):\n"
                             "        self.assertEqual(strip_cells([' a ', 'b ']), ['a', 'b'])\n\n    def test_drop"
                             "(self):\n        self.assertEqual(drop_empty_rows([['a'], [' ']]), [['a']])\n\n    def "
                             "test_header(self):\n        self.assertEqual(normalize_header(' Unit Price '), "
                             "'unit_price')\n",
}
NODE = {
    "package.json": json.dumps({
        "name": "pinboard", "version": "1.4.0", "description": "A tiny pinboard for links",
        "main": "src/server.js", "scripts": {"start": "node src/server.js", "test": "node test/run.js"},
        "dependencies": {"express": "^4.19.2"}, "engines": {"node": ">=18"}}, indent=2) + "\n",
    "README.md": "# pinboard\n\nSave links, tag them, find them later.\n\nRun `npm start`, then open the page.\n",
    ".nvmrc": "20\n",
    ".env.example": "PORT=5174\nDATABASE_URL=postgres://localhost/pinboard_dev\n",
    ".gitignore": "node_modules/\n.env\n",
    "src/server.js": "const http = require('http');\nconst { slugify } = require('./slug');\n\nconst PORT = "
                     "process.env.PORT || 5174;\n\nhttp.createServer((req, res) => {\n  res.end(slugify(req.url));\n"
                     "}).listen(PORT);\n",
    "src/slug.js": "function slugify(text) {\n  return text.toLowerCase().trim().replace(/\\s+/g, '-');\n}\n\n"
                   "module.exports = { slugify };\n",
    "test/run.js": "const assert = require('assert');\nconst { slugify } = require('../src/slug');\n\n"
                   "assert.strictEqual(slugify('Hello World'), 'hello-world');\nassert.strictEqual(slugify(' A '), "
                   "'a');\nconsole.log('2 passed');\n",
}
NOTES = {
    "todo.md": "- [ ] renew passport\n- [x] book dentist\n- [ ] call plumber about the leak\n",
    "meetings/2026-11-03.md": "# Standup\n\nAttendees: Ana, Ben\nDecided: move the release to Friday.\n",
    "meetings/2026-11-10.md": "# Planning\n\nBudget approved: 12,500 EUR.\nNext review on 24 November.\n",
    "recipes/pancakes.md": "# Pancakes\n\n- 2 eggs\n- 250 ml milk\n- 120 g flour\n- a pinch of salt\n",
    "journal.txt": "Mon: started the garden plan\nTue: fixed the bike\nWed: read two chapters\nThu: rained all day\n",
    "contacts.csv": "role,name,phone\nplumber,Mario,555-0142\ndentist,Dr Lee,555-0199\n",
    "ideas.txt": "a map of every bakery in town\na reminder for the recycling days\n",
}
REPOS = {"python": PYPKG, "node": NODE, "notes": NOTES}


@dataclass
class Outcome:
    """What one task did, read back from its Session: the answer of each turn (None for a turn without one), the
    commands that ran (command, output, outcome) and the workspace afterwards."""

    answers: list
    commands: list
    workspace: Path

    @property
    def answer(self) -> str:
        """The last turn's answer ("" when it has none)."""
        return (self.answers[-1] if self.answers else None) or ""


@dataclass(frozen=True)
class Task:
    """One task: its `name`, the repository (`repo`, a key of `REPOS`) its fresh workspace copies, the `lines`
    typed (one per turn, each after the previous turn ended), its `kind` (question, change, command, follow-up),
    the half it belongs to (fixed before any run) and `passes(outcome)`, the criterion fixed before any run."""

    name: str
    repo: str
    kind: str
    half: str
    lines: tuple
    criterion: str
    passes: Callable[[Outcome], bool] = field(repr=False)


def says(*needles: str) -> Callable[[Outcome], bool]:
    """The last answer contains every one of `needles` (case-insensitive)."""
    return lambda o: all(n.lower() in o.answer.lower() for n in needles)


def says_any(*needles: str) -> Callable[[Outcome], bool]:
    """The last answer contains one of `needles` (case-insensitive)."""
    return lambda o: any(n.lower() in o.answer.lower() for n in needles)


def says_number(number: int) -> Callable[[Outcome], bool]:
    """The last answer contains `number` as a whole number."""
    return lambda o: re.search(rf"(?<![\d.,]){number}(?![\d]|[.,]\d)", o.answer) is not None


def text_of(workspace: Path, path: str) -> str | None:
    """The text of regular file `path` in `workspace`, or None."""
    target = workspace / path
    return target.read_text(errors="replace") if target.is_file() and not target.is_symlink() else None


def file_has(path: str, *needles: str, keeps: tuple = (), lacks: tuple = ()) -> Callable[[Outcome], bool]:
    """File `path` exists and contains every one of `needles` (case-insensitive), still contains every line of
    `keeps` and none of `lacks`."""
    def check(o: Outcome) -> bool:
        text = text_of(o.workspace, path)
        return text is not None and all(n.lower() in text.lower() for n in needles) and \
            all(k in text for k in keeps) and not any(x in text for x in lacks)
    return check


def json_has(path: str, check: Callable[[dict], bool]) -> Callable[[Outcome], bool]:
    """File `path` is valid JSON and `check` holds of it."""
    def judge(o: Outcome) -> bool:
        try:
            return bool(check(json.loads(text_of(o.workspace, path) or "")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
    return judge


def some_file_has(needle: str) -> Callable[[Outcome], bool]:
    """Some text file of the workspace contains `needle` (case-insensitive)."""
    def check(o: Outcome) -> bool:
        return any(needle.lower() in p.read_text(errors="replace").lower() for p in o.workspace.rglob("*")
                   if p.is_file() and not p.is_symlink())
    return check


def ran(command: str, output: str) -> Callable[[Outcome], bool]:
    """A command matching regex `command` ran, and its output matches regex `output`."""
    return lambda o: any(re.search(command, c) and re.search(output, out) for c, out, _ in o.commands)


def both(*checks: Callable[[Outcome], bool]) -> Callable[[Outcome], bool]:
    """Every one of `checks` holds."""
    return lambda o: all(check(o) for check in checks)


TESTS_RAN = r"Ran \d+ tests?|\d+ passed"
TASKS = (
    # the Python package with tests
    Task("py-version", "python", "question", "tune", ("what version is this package?",), "says 0.3.1",
         says("0.3.1")),
    Task("py-python", "python", "question", "held", ("which python versions does it support",), "says 3.9",
         says("3.9")),
    Task("py-defines", "python", "question", "tune", ("where is normalize_header defined",), "names utils.py",
         says("utils.py")),
    Task("py-run-tests", "python", "command", "held", ("run the tests",), "a test command ran the 3 tests",
         ran(r"unittest|pytest|make\s+test", TESTS_RAN)),
    Task("py-bump", "python", "change", "tune", ("bump the patch version",), "pyproject.toml says 0.3.2, rest kept",
         file_has("pyproject.toml", 'version = "0.3.2"', keeps=('name = "tidy-csv"', 'dependencies = ["click>=8.0"]'))),
    Task("py-changelog", "python", "change", "held", ("add a line to the changelog saying fixed empty rows",),
         "CHANGELOG.md gains the line, keeps the releases",
         file_has("CHANGELOG.md", "fixed empty rows", keeps=("## 0.3.0", "- first release", "## 0.3.1"))),
    Task("py-max-columns", "python", "change", "tune", ("in utils.py change MAX_COLUMNS to 512",),
         "src/tidy_csv/utils.py says 512, keeps normalize_header; no new top-level utils.py",
         both(file_has("src/tidy_csv/utils.py", "MAX_COLUMNS = 512", keeps=("def normalize_header(name):",)),
              lambda o: not (o.workspace / "utils.py").exists())),
    Task("py-readme", "python", "question", "held", ("what does this tool do?",), "says messy CSV",
         says("messy csv")),
    Task("py-gitignore", "python", "change", "tune", ("add .DS_Store to the gitignore",),
         ".gitignore gains .DS_Store, keeps __pycache__/; no gitignore.txt",
         both(file_has(".gitignore", ".DS_Store", keeps=("__pycache__/", "dist/")),
              lambda o: not (o.workspace / "gitignore.txt").exists())),
    Task("py-delimiter", "python", "question", "held", ("what's the default delimiter?",), "says ';'",
         says_any('";"', "';'", "semicolon", "= ;")),
    Task("py-license", "python", "question", "tune", ("which license is it under",), "says MIT", says("mit")),
    Task("py-follow-bump", "python", "follow-up", "held", ("what version is it?", "bump it to 0.4.0"),
         "pyproject.toml says 0.4.0, rest kept",
         file_has("pyproject.toml", 'version = "0.4.0"', keeps=('name = "tidy-csv"',))),
    Task("py-follow-where", "python", "follow-up", "tune",
         ("is there a function that drops empty rows?", "which file is it in?"), "names cleaner.py",
         says("cleaner.py")),
    Task("py-deps", "python", "question", "held", ("what does it depend on",), "says click", says("click")),
    Task("py-unittest", "python", "command", "tune", ("can you run python3 -m unittest discover -s tests",),
         "that command ran the tests", ran(r"python3? -m unittest", TESTS_RAN)),
    # the Node project
    Task("node-port", "node", "question", "tune", ("what port does the server listen on?",), "says 5174",
         says_number(5174)),
    Task("node-npm-test", "node", "command", "held", ("can you run npm test",), "npm test ran, 2 passed",
         ran(r"\bnpm (run )?test\b", r"2 passed")),
    Task("node-nvmrc", "node", "question", "tune", ("which node version should i use for this",), "says 20",
         says_number(20)),
    Task("node-start", "node", "question", "held", ("how do i start it",), "says npm start or node src/server.js",
         says_any("npm start", "node src/server.js")),
    Task("node-port-change", "node", "change", "tune", ("change the default port to 8080",),
         "src/server.js says 8080, keeps the server",
         file_has("src/server.js", "8080", keeps=("http.createServer((req, res) => {", "const { slugify }"),
                  lacks=("5174",))),
    Task("node-slug", "node", "question", "tune", ("which file has the slugify function",), "names slug.js",
         says("slug.js")),
    Task("node-database", "node", "question", "tune", ("what database does it use",), "says pinboard_dev",
         says_any("pinboard_dev", "postgres")),
    Task("node-bump", "node", "change", "held", ("bump the minor version",), "package.json is 1.5.0, valid JSON",
         json_has("package.json", lambda p: p["version"] == "1.5.0" and p["scripts"]["test"] == "node test/run.js")),
    Task("node-ignore", "node", "change", "held", ("also ignore .env.local",),
         ".gitignore gains .env.local, keeps node_modules/",
         file_has(".gitignore", ".env.local", keeps=("node_modules/",))),
    Task("node-deps", "node", "question", "held", ("what are its dependencies",), "says express", says("express")),
    Task("node-follow-port", "node", "follow-up", "tune", ("where is the port set?", "make it 3000"),
         "src/server.js says 3000, keeps the server",
         file_has("src/server.js", "3000", keeps=("http.createServer((req, res) => {",))),
    Task("node-check-tests", "node", "command", "tune", ("check whether the tests pass",),
         "the project's test command ran, 2 passed", ran(r"\bnpm (run )?test\b|node test/run\.js", r"2 passed")),
    Task("node-name", "node", "question", "held", ("what's this project called",), "says pinboard",
         says("pinboard")),
    Task("node-follow-test-script", "node", "follow-up", "held",
         ("what's the test script?", "run it"), "node test/run.js ran (directly or through npm), 2 passed",
         ran(r"\bnpm (run )?test\b|node test/run\.js", r"2 passed")),
    # the folder of notes
    Task("notes-todo", "notes", "question", "tune", ("what's still left on my todo list?",),
         "says passport and plumber", says("passport", "plumber")),
    Task("notes-tick", "notes", "change", "held", ("tick off renew passport",),
         "todo.md marks it done, keeps the plumber line",
         file_has("todo.md", "[x] renew passport", keeps=("- [ ] call plumber about the leak",))),
    Task("notes-add-todo", "notes", "change", "tune", ("add buy stamps to my todo list",),
         "todo.md gains buy stamps, keeps all three items",
         file_has("todo.md", "buy stamps", keeps=("renew passport", "book dentist", "call plumber about the leak"))),
    Task("notes-review", "notes", "question", "held", ("when is the next review?",), "says 24 November",
         says("24 november")),
    Task("notes-budget", "notes", "question", "tune", ("how much was the budget?",), "says 12,500",
         says_any("12,500", "12500", "12 500")),
    Task("notes-standup", "notes", "question", "tune", ("who was at the standup",), "says Ana and Ben",
         says("ana", "ben")),
    Task("notes-eggs", "notes", "question", "held", ("how many eggs do i need for pancakes",), "says 2",
         says_number(2)),
    Task("notes-plumber", "notes", "question", "held", ("what's the plumber's number",), "says 555-0142",
         says("555-0142")),
    Task("notes-idea", "notes", "change", "held", ("write down an idea: a bot that waters the plants",),
         "a file holds it; ideas.txt keeps both ideas",
         both(some_file_has("waters the plants"),
              file_has("ideas.txt", keeps=("a map of every bakery in town", "a reminder for the recycling days")))),
    Task("notes-journal", "notes", "change", "held", ("add a line to my journal saying shipped the release",),
         "journal.txt gains it, keeps the four days",
         file_has("journal.txt", "shipped the release",
                  keeps=("Mon: started the garden plan", "Tue: fixed the bike", "Wed: read two chapters",
                         "Thu: rained all day"))),
    Task("notes-follow-todo", "notes", "follow-up", "tune", ("what's on my todo list", "add call mum to it"),
         "todo.md gains call mum, keeps all three items",
         file_has("todo.md", "call mum", keeps=("renew passport", "book dentist", "call plumber about the leak"))),
    Task("notes-follow-milk", "notes", "follow-up", "held", ("find the pancake recipe", "how much milk does it need"),
         "says 250 ml", says_any("250 ml", "250ml")),
    Task("notes-meetings", "notes", "question", "tune", ("list my meeting notes",),
         "names both meeting files", says("2026-11-03", "2026-11-10")),
    Task("notes-count-journal", "notes", "command", "held", ("how many lines are in my journal",), "says 4",
         says_number(4)),
    Task("notes-release", "notes", "question", "tune", ("when are we releasing?",), "says Friday", says("friday")),
    Task("notes-follow-dentist", "notes", "follow-up", "held", ("what's the dentist called?", "and their number?"),
         "says 555-0199", says("555-0199")),
)


def approve(tool: str, arguments: dict) -> str:
    """The answer a careful user gives at the approval prompt: "y" for a write or edit of a workspace file, "y" for
    `run_command` when every command of its pipeline is one of `HARMLESS` (no redirection, substitution, `-c`,
    `rm`, `..` or install), else "n"."""
    if tool in WRITERS:
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


class Screen:
    """`emelex chat` on a pseudo-terminal of `COLUMNS` x `ROWS`, its output rendered by a terminal emulator
    (`pyte`), as a person at a terminal sees it; lines are typed through the terminal."""

    def __init__(self, home: Path, workspace: Path, policy: str) -> None:
        import pyte  # a dev dependency

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        env = {**os.environ, "EMELEX_HOME": str(home), "PYTHONUNBUFFERED": "1", "TERM": "xterm",
               "COLUMNS": str(COLUMNS), "LINES": str(ROWS)}
        self.process = subprocess.Popen([*EMELEX, "chat", "--workspace", str(workspace), "--policy", policy],
                                        env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
        os.close(slave)
        self.master = master
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self.stream = pyte.Stream(self.screen)
        self.raw = ""
        self.lock = threading.Condition()
        self.closed = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        while True:
            try:
                piece = os.read(self.master, 65536)
            except OSError:  # EIO: the chat closed the terminal
                piece = b""
            with self.lock:
                if not piece:
                    self.closed = True
                    self.lock.notify_all()
                    return
                text = piece.decode("utf-8", "replace")
                self.raw += text
                self.stream.feed(text)
                self.lock.notify_all()

    def lines(self) -> list[str]:
        """The screen's lines, trailing blanks cut, down to the cursor's."""
        with self.lock:
            return [line.rstrip() for line in self.screen.display[:self.screen.cursor.y + 1]]

    def cursor_line(self) -> str:
        """The line the cursor is on, up to the cursor."""
        with self.lock:
            return self.screen.display[self.screen.cursor.y][:self.screen.cursor.x]

    def wait_for(self, ready: Callable[[str], str | None], deadline: float) -> str | None:
        """Wait until `ready(the cursor's line)` says what the screen waits for; None at the deadline or the end."""
        with self.lock:
            while True:
                seen = ready(self.screen.display[self.screen.cursor.y][:self.screen.cursor.x])
                if seen is not None:
                    return seen
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    return None
                self.lock.wait(min(left, 0.5))

    def type(self, line: str) -> None:
        """Type one line and Enter."""
        os.write(self.master, line.encode() + b"\r")

    def end(self) -> int:
        """Type /exit; the exit status (killed with its process group after 60 s)."""
        try:
            self.type("/exit")
        except OSError:
            pass
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(timeout=60)
        finally:
            os.close(self.master)


def at_prompt(line: str) -> str | None:
    """"prompt" when the cursor waits after the chat's "> ", "approval" after its approval question."""
    if line == "> ":
        return "prompt"
    if line.startswith("approve this call?") and line.endswith(": "):
        return "approval"
    return None


SESSION = re.compile(r"session ([0-9a-f-]{36})")
FACT = re.compile(r"[\w./:-]*(?:\d|\w[._]\w)[\w./:-]*")  # a token with a digit, or a dot or underscore inside


def asked_call(home: Path, session: str) -> tuple[str, dict]:
    """The call an approval prompt asks about: the first call of the Session's journaled batch not yet started."""
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        turn = read_journal(store, session)
    for call in turn.calls if turn is not None else ():
        if call.state == "planned":
            return call.tool, call.arguments
    return "", {}


def session_record(home: Path, session: str, typed: list[str]) -> dict:
    """What the Session's transcript says: each turn's answer, the commands that ran (command, output, outcome),
    the calls run, how many repeated an identical call already run in the turn since the last write, how many
    answers state a fact nothing read or typed holds (in a turn that ran no tool), and the reason of a forced
    answer or a failed turn."""
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        events = list(store.replay(session).events)
    answers: list = []
    commands: list = []
    read = " ".join(typed).lower()
    turn_ran, arguments = 0, {}
    runs = repeats = ungrounded = 0
    ran: list[str] = []
    forced = failed = None
    for event in events:
        payload = event.payload
        if event.kind == "user":
            turn_ran, ran = 0, []
        elif event.kind == "context":
            read += " " + json.dumps(payload, ensure_ascii=False).lower()
        elif event.kind == "tool_calls":
            for call in payload.get("calls", []):
                arguments[call["call_id"]] = (call["tool"], call["arguments"])
        elif event.kind == "tool_result":
            tool, args = arguments.get(payload.get("call_id"), ("", {}))
            output = payload.get("output")
            output = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            read += " " + output.lower()
            if tool == "run_command":
                commands.append((str(args.get("command", "")), output, payload.get("outcome")))
            if payload.get("outcome") == "ok":
                key = json.dumps([tool, args], sort_keys=True)
                repeats += key in ran
                runs += 1
                turn_ran += 1
                ran.append(key)
                if tool in WRITERS or tool == "run_command":
                    ran = []
        elif event.kind == "assistant":
            text = payload.get("text") or ""
            answers.append(text)
            if not turn_ran and any(f.lower().strip(".:,") not in read for f in FACT.findall(text)):
                ungrounded += 1
        elif event.kind == "turn_failed":
            failed = payload
            answers.append(None)
        elif event.kind == "audit" and payload.get("forced"):
            forced = payload["forced"]
    return {"answers": answers, "commands": commands, "ran": runs, "repeats": repeats, "ungrounded": ungrounded,
            "forced": forced, "ended": "answer" if answers and answers[-1] is not None else
            (failed or {}).get("reason", "none"), "diagnostic": (failed or {}).get("diagnostic", "")}


def lost_lines(before: dict[str, str], workspace: Path, shown: str) -> list[str]:
    """The lines of the files `before` holds that the workspace no longer has and no approval screen (`shown`)
    showed as a removed "-" line."""
    shown_removed = {line[1:].strip() for line in shown.splitlines() if line.startswith("-")}
    lost = []
    for path, text in before.items():
        now = text_of(workspace, path)
        kept = set((now or "").splitlines())
        lost += [f"{path}: {line}" for line in text.splitlines()
                 if line.strip() and line not in kept and line.strip() not in shown_removed]
    return lost


def run_task(home: Path, task: Task, root: Path, policy: str) -> dict:
    """Run `task` in a fresh copy of its repository under `root` through a new chat under turn `policy` on a
    pseudo-terminal; its row of the results table."""
    workspace = root / f"{task.name}-{policy}"
    files = REPOS[task.repo]
    for path, text in files.items():
        target = workspace / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    screen = Screen(home, workspace, policy)
    row = {"task": task.name, "kind": task.kind, "half": task.half, "criterion": task.criterion, "approved": 0,
           "denied": 0, "policy": policy, "timed_out": False, "erased": 0}
    shown: list[str] = []
    session = None
    try:
        if screen.wait_for(at_prompt, time.monotonic() + START_DEADLINE_S) != "prompt":
            raise RuntimeError(f"the chat did not start: {screen.raw[-500:]!r}")
        session = SESSION.search("\n".join(screen.lines())).group(1)
        begin = time.monotonic()
        for line in task.lines:
            screen.type(line)
            deadline = time.monotonic() + TURN_DEADLINE_S[policy]
            time.sleep(0.3)  # the typed line's echo moves the cursor off the prompt
            while True:
                seen = screen.wait_for(at_prompt, deadline)
                if seen == "approval":
                    shown.append("\n".join(screen.lines()[-40:]))
                    decision = approve(*asked_call(home, session))
                    row["approved" if decision == "y" else "denied"] += 1
                    screen.type(decision)
                    time.sleep(0.3)
                    continue
                break
            if seen is None:
                row["timed_out"] = True
                os.killpg(screen.process.pid, signal.SIGINT)
                screen.wait_for(at_prompt, time.monotonic() + 60)
                break
            answers = session_record(home, session, list(task.lines))["answers"]
            first = (answers[-1] or "").strip().splitlines()[:1] if answers else []
            text = " ".join("\n".join(screen.lines()).split())
            row["erased"] += bool(first and " ".join(first[0].split())[:60] not in text)
        row["seconds"] = time.monotonic() - begin
    finally:
        row["exit"] = screen.end()
    record = session_record(home, session, list(task.lines)) if session else \
        {"answers": [], "commands": [], "ran": 0, "repeats": 0, "ungrounded": 0, "forced": None, "ended": "none",
         "diagnostic": "did not start"}
    outcome = Outcome(record.pop("answers"), record.pop("commands"), workspace)
    row.update(record)
    row["answer"] = outcome.answers[-1] if outcome.answers else None
    row["commands"] = [c for c, _, _ in outcome.commands]
    row["lost"] = lost_lines(files, workspace, "\n".join(shown))
    row["passed"] = bool(task.passes(outcome))
    return row


def _cell(text: str) -> str:
    text = " ".join(str(text).split())
    if len(text) > ANSWER_CHARS:
        text = text[:ANSWER_CHARS - 1] + "\u2026"
    return text.replace("|", "\\|").replace("`", "'")


def totals(rows: list[dict]) -> dict:
    """A policy's figures over its `rows`: tasks passed per half, turns without an answer, repeated calls, writes
    that lost content unshown, answers with nothing read, answers erased, mean seconds."""
    return {**{half: sum(r["passed"] for r in rows if r["half"] == half) for half in HALVES},
            **{f"{half}_count": sum(r["half"] == half for r in rows) for half in HALVES},
            "unanswered": sum(r["ended"] != "answer" for r in rows), "repeats": sum(r["repeats"] for r in rows),
            "lost": sum(bool(r["lost"]) for r in rows), "ungrounded": sum(r["ungrounded"] for r in rows),
            "erased": sum(r["erased"] for r in rows), "mean": statistics.fmean(r["seconds"] for r in rows)}


def render(figures: dict) -> str:
    """The `chat-tasks` section of the recorded `figures`."""
    rows = figures["tasks"]
    opened = {r["task"]: r for r in figures["open"]}
    guided, free = totals(rows), totals(figures["open"])
    held_target = TARGET_HELD_SHARE * guided["held_count"]

    def cells(r: dict) -> str:
        ended = r["ended"] + (f" (forced: {r['forced']})" if r.get("forced") else "")
        shown = r["answer"] if r["answer"] is not None else r.get("diagnostic", "")
        if r["commands"]:
            shown = f"ran `{'; '.join(r['commands'])}`: {shown}"
        return (f"{'yes' if r['passed'] else 'no'} | {r['seconds']:.1f} s | {r['ran']} | {r['approved']}/{r['denied']} "
                f"| {ended} | {_cell(shown)}")

    def policy_lines(name: str, t: dict) -> list[str]:
        return [f"- {name}: tuning half passed {t['tune']} of {t['tune_count']}; held-out half passed {t['held']} of "
                f"{t['held_count']}; turns without an answer: {t['unanswered']}; identical calls run again: "
                f"{t['repeats']}; mean time per task: {t['mean']:.1f} s"]

    table = ["| task | half | kind | criterion | guided: passed | time | calls run | approvals y/n | ended | answer | "
             "open: passed | time | calls run | approvals y/n | ended | answer |",
             "| --- " * 16 + "|"]
    for r in rows:
        table.append(f"| {r['task']} | {r['half']} | {r['kind']} | {_cell(r['criterion'])} | {cells(r)} | "
                     f"{cells(opened[r['task']])} |")
    lost = [f"- {r['policy']} {r['task']}: {_cell('; '.join(r['lost']))}" for r in rows + figures["open"] if r["lost"]]
    return "\n".join([
        "## Chat tasks (`bench_chat_tasks.py`)",
        "",
        f"Measured {figures['measured']} on {figures['model']}, every chat setting at its default but the turn "
        f"policy, through the real `emelex chat` process on a pseudo-terminal whose screen a terminal emulator "
        f"(pyte) rendered: {len(rows)} tasks worded as people type, over three small repositories (a Python "
        "package with tests, a Node project, a folder of notes), one new Session per task and policy in a fresh "
        "copy of its repository; the task's lines typed at the prompt one after another; writes and edits "
        "approved, commands approved only for a few harmless programs and the projects' own runners. Each task "
        "runs under the guided policy (this model's default) and under the open one (`--policy open`), each "
        "policy in a process of its own, the two at the same time (a turn is cut after 180 s under the guided "
        "policy, 60 s under the open one, and its task fails). The tasks, their criteria and their halves were fixed before the first "
        "run; rules may be tuned on the tuning half only, never on the held-out one. Time: from typing the first "
        "line to the last prompt's return (the model load excluded), on a shared 2-core machine"
        f"{figures.get('load', '')}, so noisy. The targets are the guided policy's; the open one has none.",
        "",
        f"- guided: held-out half passed: {guided['held']} of {guided['held_count']} "
        f"({verdict(guided['held'], '>=', held_target)}); tuning half: {guided['tune']} of {guided['tune_count']}",
        f"- guided: tasks whose writes lost content the approval did not show: {guided['lost']} "
        f"({verdict(guided['lost'], '<=', 0)})",
        f"- guided: answers with nothing read: {guided['ungrounded']} ({verdict(guided['ungrounded'], '<=', 0)})",
        f"- guided: answers erased from the screen: {guided['erased']} ({verdict(guided['erased'], '<=', 0)})",
        *policy_lines("guided", guided),
        *policy_lines("open", free),
        f"- open: tasks whose writes lost content unshown: {free['lost']}; answers with nothing read: "
        f"{free['ungrounded']}; answers erased: {free['erased']} (no target)",
        "",
        *table,
        "",
        *(["Lines lost without being shown at an approval:", "", *lost, ""] if lost else []),
    ])


def run_policy(policy: str, out: Path, half: str | None = None) -> int:
    """Run every task (of `half` only, when given) under `policy` alone, writing its rows and the model's name to
    `out` (JSON); 0."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="emelex-chat-tasks-") as tmp:
        home, root = Path(tmp) / "home", Path(tmp) / "workspaces"
        root.mkdir()
        with ModelManager(WorkerSettings(home=home)) as manager:
            model = manager.install_default(link=True)
        for task in (t for t in TASKS if half in (None, t.half)):
            rows.append(row := run_task(home, task, root, policy))
            print(f"{task.name:<24} {task.half} {policy:<6} {'PASS' if row['passed'] else 'fail'} "
                  f"{row['seconds']:6.1f} s ran {row['ran']} commands {row['commands']} lost {len(row['lost'])} "
                  f"ungrounded {row['ungrounded']} erased {row['erased']} ended {row['ended']}: "
                  f"{(row['answer'] or row['diagnostic'])[:100]!r}", flush=True)
            out.write_text(json.dumps({"model": model.name, "rows": rows, "load": os.getloadavg()[0]}))
    return 0


def main() -> int:
    """Run both policies, each in a process of its own at the same time (`--policy NAME --out FILE` runs one),
    then write the section from their rows; 1 when a target is missed (or the model is missing). The targets
    are pass rates and counts, not times, so the two sides need not alternate. `--half tune` (or `held`) runs the
    guided policy on that half alone, for tuning: it prints its rows and passes and writes no section."""
    try:
        default_model_file()
    except DefaultModelUnavailableError as exc:
        print(f"skipped: {exc}")
        return 1
    if sys.argv[1:2] == ["--policy"]:
        return run_policy(sys.argv[2], Path(sys.argv[4]))
    if sys.argv[1:2] == ["--half"]:
        if sys.argv[2:3] not in ([half] for half in HALVES):
            print(f"--half takes one of: {', '.join(HALVES)}")
            return 2
        with tempfile.TemporaryDirectory(prefix="emelex-chat-rows-") as tmp:
            run_policy("guided", Path(tmp) / "guided.json", half=sys.argv[2])
            rows = json.loads((Path(tmp) / "guided.json").read_text())["rows"]
        print(f"guided, {sys.argv[2]} half: {sum(r['passed'] for r in rows)} of {len(rows)} passed (no section "
              "written: a partial run)")
        return 0
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="emelex-chat-rows-") as tmp:
        outs = {policy: Path(tmp) / f"{policy}.json" for policy in POLICIES}
        runs = [subprocess.Popen([sys.executable, __file__, "--policy", policy, "--out", str(outs[policy])])
                for policy in POLICIES]
        for run in runs:
            run.wait()
        done = {policy: json.loads(outs[policy].read_text()) for policy in POLICIES}
    if any(len(d["rows"]) != len(TASKS) for d in done.values()):
        print("a policy's run did not finish every task")
        return 1
    load = (f" (load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; the two policies ran "
            "at the same time, each in a process of its own)")
    figures = {"model": done["guided"]["model"], "tasks": done["guided"]["rows"], "open": done["open"]["rows"],
               "load": load}
    text = publish("chat-tasks", render, figures)
    print(text)
    guided = totals(figures["tasks"])
    ok = (met(guided["held"], ">=", TARGET_HELD_SHARE * guided["held_count"]) and guided["lost"] == 0
          and guided["ungrounded"] == 0 and guided["erased"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
