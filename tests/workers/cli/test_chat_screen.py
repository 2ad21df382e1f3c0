"""What `emelex chat` shows while a turn runs and what happens to lines typed during it, in a real subprocess on
the scripted binding of the agent test plugin: on a terminal (a pseudo-terminal here) a status line is redrawn
in place while the model works and a line typed during a turn is dropped with a notice; with standard input and
output not terminals (a script) lines are read in order and nothing is redrawn; every turn ends with one line of
its time, rounds, tool calls and token counts."""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pyte

from ...support.agent import answer, calls
from .test_chat_cli import EMELEX, chat, env, events, wait_for_file  # noqa: F401  (env is a fixture)

WAIT_S = 60
STATS = re.compile(r"\[\d+\.\d s, (\d+) rounds?, (\d+) tool calls?(, (\d+) prompt \+ (\d+) generated tokens)?\]")


class Terminal:
    """`emelex chat` on a pseudo-terminal (its standard input and output) of `columns` x `rows`, as a user at a
    terminal runs it: what it writes is collected raw (carriage returns and all) and rendered by a terminal
    emulator (pyte), the screen a person sees; lines are typed through the terminal, which echoes them."""

    def __init__(self, env: dict, workspace: Path, options: dict, columns: int = 100, rows: int = 60) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        environment = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}  # the size is the terminal's
        self.process = subprocess.Popen(
            [*EMELEX, "chat", "--workspace", str(workspace), "--model", "scripted"],
            env={**environment, "EMELEX_AGENT_TEST": json.dumps(options)}, stdin=slave, stdout=slave,
            stderr=subprocess.PIPE, text=True)
        os.close(slave)
        self.master = master
        self.output = ""
        self.screen = pyte.Screen(columns, rows)
        self._stream = pyte.Stream(self.screen)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a character may span two reads
        self._changed = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def display(self) -> list[str]:
        """The screen's lines as a person sees them now (trailing blanks cut)."""
        with self._changed:
            return [line.rstrip() for line in self.screen.display]

    def resize(self, columns: int, rows: int) -> None:
        """Resize the terminal (the emulator and the pseudo-terminal) and tell the chat, as a window resize does."""
        with self._changed:
            self.screen.resize(rows, columns)
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.process.send_signal(signal.SIGWINCH)

    def _pump(self) -> None:
        while True:
            try:
                piece = os.read(self.master, 4096)
            except OSError:  # EIO: the chat closed the terminal's last descriptor
                piece = b""
            if not piece:
                return
            with self._changed:
                text = self._decoder.decode(piece)
                self.output += text
                self._stream.feed(text)
                self._changed.notify_all()

    def expect(self, text: str, after: int = 0) -> int:
        """Wait (at most `WAIT_S`) until the output from offset `after` contains `text`; the offset past it."""
        with self._changed:
            assert self._changed.wait_for(lambda: text in self.output[after:], timeout=WAIT_S), self.output
            return self.output.index(text, after) + len(text)

    def type(self, line: str) -> None:
        """Type one line and Enter."""
        os.write(self.master, (line + "\n").encode())

    def wait(self) -> int:
        """Its exit status (waited for at most `WAIT_S`); the terminal is closed then."""
        try:
            return self.process.wait(timeout=WAIT_S)
        finally:
            os.close(self.master)


def test_a_line_typed_during_a_turn_on_a_terminal_is_dropped_with_a_notice(env, home, workspace, tmp_path) -> None:
    """A `y` pasted with the message, or typed while the model works, never approves the call proposed later,
    and neither `/exit` nor `ls` typed then runs once the prompt returns: each is dropped, saying so, and the
    user answers the prompt afresh."""
    effects, generating, hold = tmp_path / "effects", tmp_path / "generating", tmp_path / "hold"
    terminal = Terminal(env, workspace, {"outputs": [calls(("effect", {"label": "a"})), answer("after the denial")],
                                         "effects": str(effects), "generating": str(generating),
                                         "hold_generation": str(hold)})
    at = terminal.expect("\n> ", terminal.expect("; commands:"))
    terminal.type("go\ny")  # pasted at the prompt, which takes one line: the second is typed ahead
    wait_for_file(generating)
    at = terminal.expect("not sent: 'y' was typed while the turn ran", at)
    at = terminal.expect(" round 1: reading the prompt, 0 of ", at)  # redrawn in place while held
    terminal.expect("(Ctrl-C interrupts)", at)
    assert re.search(r"\r\x1b\[K[|/\\-] round 1: reading the prompt", terminal.output)
    for line in ("y", "/exit", "ls"):
        terminal.type(line)
        at = terminal.expect(f"not sent: {line!r} was typed while the turn ran; type it again at the prompt", at)
    hold.touch()
    at = terminal.expect("approve this call? [y]es / [n]o / [a]bort the turn: ", at)
    terminal.type("n")
    at = terminal.expect("<- effect: denied", at)
    at = terminal.expect("after the denial", at)
    at = terminal.expect("\n> ", at)
    (stats,) = STATS.findall(terminal.output)
    assert stats[:2] == ("2", "1") and stats[3]
    terminal.type("/exit")
    assert terminal.wait() == 0, terminal.process.stderr.read()
    assert not effects.exists()
    assert [k for k, _ in events(home)] == ["context", "user", "tool_calls", "tool_result", "assistant", "audit"]


def test_lines_piped_in_by_a_script_are_read_in_order(env, home, workspace, tmp_path) -> None:
    """Standard input not a terminal: every line is kept and answers the next prompt, as a script means it."""
    effects = tmp_path / "effects"
    out = chat(env, workspace, "go\ny\nagain\n", [calls(("effect", {"label": "a"})), answer("one"), answer("two")],
               effects)
    assert out.returncode == 0, out.stderr
    assert "not sent" not in out.stdout
    assert effects.read_text().count(" a\n") == 1
    assert [k for k, _ in events(home)].count("user") == 2


def test_every_turn_ends_with_its_time_rounds_calls_and_tokens_and_a_script_sees_no_status_line(
        env, home, workspace, tmp_path) -> None:
    """Standard output not a terminal: nothing is redrawn; each turn's last line sums its rounds' token counts
    (the scripted binding counts 4 characters as one token)."""
    rounds = [calls(("effect", {"label": "a"})), answer("one")]
    out = chat(env, workspace, "go\ny\n", rounds, tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stdout and "\x1b" not in out.stdout and "round 1:" not in out.stdout
    (stats,) = STATS.findall(out.stdout)
    generated = sum(-(-len(json.dumps(r, separators=(",", ":"))) // 4) for r in rounds)
    assert stats[:2] == ("2", "1") and int(stats[3]) > 0 and int(stats[4]) == generated
    # the answer's line (then, after a new Session's first turn, what it recalled), then this one
    assert re.search("\none\n(\\[no notes recalled from earlier Sessions\\]\n)?" + STATS.pattern + "\n> ", out.stdout)


def test_an_answer_the_limit_forced_says_so() -> None:
    """`forced` (the adapter's reason, read with getattr) marks the answer; an answer without it, or an adapter
    without the field, shows none; a turn without an answer shows its outcome and diagnostic."""
    from types import SimpleNamespace

    from emelex_workers.agent.durable import TurnResult
    from emelex_workers.cli.chat_show import ending_line

    forced = SimpleNamespace(outcome="answer", answer="8080", rounds=5, calls=4, diagnostic="",
                             forced="the chain limit of 4 tool rounds was reached")
    assert ending_line(forced) == "[limit-forced answer: the chain limit of 4 tool rounds was reached]"
    assert ending_line(TurnResult("answer", "8080", 2, 1)) is None
    assert ending_line(TurnResult("error", None, 5, 8, "the model asked for more than 4 tool rounds")) == \
        "[turn error: the model asked for more than 4 tool rounds]"
    assert ending_line(TurnResult("answer", "a", 5, 4, forced="chain_limit")) == \
        "[limit-forced answer: the model used all of this turn's tool rounds, so it answered from what it had read]"
    assert "found nothing new" in ending_line(TurnResult("answer", "a", 3, 2, forced="repeat"))


def test_a_round_cut_at_a_repetition_does_not_swallow_the_next_rounds(capsys) -> None:
    """The adapter ends a runaway round without its closing brackets; the next round's answer still shows."""
    from emelex_workers.cli.chat import AnswerStream

    rounds: list[str] = []
    stream = AnswerStream(rounds.append)
    for piece in ['{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"This is a file. This']:
        stream.feed(piece)
    stream.next_round()
    for piece in ['{"answer":', ' "a.txt: wrote', ' 4 bytes"}']:
        stream.feed(piece)
    assert capsys.readouterr().out == "a.txt: wrote 4 bytes"
    assert rounds == ['{"answer": "a.txt: wrote 4 bytes"}']


def test_careless_input_gets_a_clear_answer_and_runs_no_turn(env, home, workspace, tmp_path) -> None:
    """/help lists every command with what it does, a /tools verb without a name shows its usage, an unknown
    command says a message must not start with /, empty lines do nothing, and end of input closes the chat on a
    line of its own."""
    out = chat(env, workspace, "\n  \n/help\n/tools disable\n/etc/hosts says what?\n", [], tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    for usage in ("/tools disable NAME", "/tools enable NAME", "/compact", "/help", "/exit"):
        assert re.search(f"^  {re.escape(usage)} +\\w", out.stdout, re.M), usage
    assert "usage: /tools disable NAME (the names: /tools)" in out.stdout
    assert "unknown command '/etc/hosts says what?'" in out.stdout
    assert "a message to the model must not start with /" in out.stdout
    assert out.stdout.endswith("> \nsession " + out.stdout.split()[1].rstrip(";") + " closed\n")
    assert [k for k, _ in events(home)] == []


def test_an_answer_stays_on_the_screen_while_the_round_ends(env, home, workspace) -> None:
    """The status line is never drawn over an answer's line: after the answer's last token, while its round ends
    (here a second, five redraws of the status line), the answer stays whole on the terminal."""
    words = "The port is 8421. It is set in config.ini, under [server]."
    terminal = Terminal(env, workspace, {"outputs": [answer(words)], "linger_s": 1.0})
    try:
        at = terminal.expect("\n> ", terminal.expect("; commands:"))
        terminal.type("What port?")
        at = terminal.expect(words, at)
        terminal.expect("\n> ", at)
        assert terminal.output[at:].startswith("\r\n["), repr(terminal.output[at:at + 80])  # ended, not erased
        terminal.type("/exit")
        assert terminal.wait() == 0, terminal.process.stderr.read()
    finally:
        if terminal.process.poll() is None:
            terminal.process.kill()
