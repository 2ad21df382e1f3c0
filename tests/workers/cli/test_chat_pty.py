"""What a person at a terminal sees of `emelex chat`: the real chat on a pseudo-terminal, its output rendered by a
terminal emulator (pyte), on the scripted binding of the agent test plugin. Whatever the order in which the model's
text, its progress reports and the status line's redraws arrive, nothing the chat said is drawn over: answers,
limit-forced answers, tool calls and their output, an interrupt's notice, and after a resize of the window; and no
status line is left on the screen once a turn ended."""

from __future__ import annotations

import os
import signal
import time

from ...support.agent import answer, calls
from .test_chat_cli import env  # noqa: F401  (a fixture)
from .test_chat_screen import Terminal, wait_for_file

STATUS = "(Ctrl-C interrupts)"  # the end of every status line


def started(terminal: Terminal) -> int:
    """Wait for the chat's first prompt; the output's offset past it."""
    return terminal.expect("\n> ", terminal.expect("; commands:"))


def settle(terminal: Terminal, at: int) -> list[str]:
    """Wait for the prompt after a turn (from output offset `at`), then a moment for any late redraw; the screen."""
    terminal.expect("\n> ", at)
    time.sleep(0.6)  # three of the status line's ticks: a redraw racing the turn's end would land by then
    return terminal.display()


def close(terminal: Terminal) -> None:
    """Type /exit and check the chat ended cleanly; kill it if it did not."""
    try:
        terminal.type("/exit")
        assert terminal.wait() == 0, terminal.process.stderr.read()
    finally:
        if terminal.process.poll() is None:
            terminal.process.kill()


def line_of(screen: list[str], text: str) -> int:
    """The index of the screen line holding `text` (which must be there, whole)."""
    found = [n for n, line in enumerate(screen) if text in line]
    assert found, "\n".join(screen)
    return found[-1]


def test_an_answer_stays_when_its_rounds_progress_arrives_after_its_text(env, home, workspace) -> None:
    """A binding whose report of a round comes only after the round's last token (here the scripted one, then a
    second of lingering: five redraws of the status line) leaves the answer whole on the screen, on its own line,
    with the turn's summary below it."""
    words = "config.toml: port = 5174"
    terminal = Terminal(env, workspace, {"outputs": [answer(words)], "progress_after_text": True, "linger_s": 1.0})
    try:
        at = started(terminal)
        terminal.type("which port?")
        screen = settle(terminal, terminal.expect(words, at))
        row = line_of(screen, words)
        assert screen[row] == words, "\n".join(screen)
        ending = screen[row + 1:row + 3]  # a first turn says what it recalled before its closing line
        assert any(line.startswith("[") and " round" in line for line in ending), "\n".join(screen)
        assert not any(STATUS in line for line in screen), "\n".join(screen)
    finally:
        close(terminal)


def test_a_limit_forced_answer_and_the_tool_calls_before_it_stay(env, home, workspace, tmp_path) -> None:
    """Tool rounds, then the answer the chain limit forced: every proposed call, its outcome and output, the
    answer and the line saying it was forced are all on the screen at the end, none drawn over."""
    outputs = [calls(("peek", {"label": f"p{n}"})) for n in range(1, 5)] + [answer("the labels were peeked")]
    terminal = Terminal(env, workspace, {"outputs": outputs, "progress_after_text": True, "linger_s": 0.4})
    try:
        at = started(terminal)
        terminal.type("peek at everything")
        screen = settle(terminal, terminal.expect("[limit-forced answer", at))
        rows = [line_of(screen, f'-> peek {{"label": "p{n}"}}') for n in range(1, 5)]
        rows += [line_of(screen, f"peeked p{n}") for n in range(1, 5)]
        answered = line_of(screen, "the labels were peeked")
        assert screen[answered] == "the labels were peeked"
        assert screen[answered + 1].startswith("[limit-forced answer"), "\n".join(screen)
        assert max(rows) < answered
        assert not any(STATUS in line for line in screen), "\n".join(screen)
    finally:
        close(terminal)


def test_an_interrupt_says_so_on_a_line_that_stays(env, home, workspace, tmp_path) -> None:
    """Ctrl-C while the model works: the notice, then how the turn ended, stay on the screen; no status line is
    left over."""
    generating, hold = tmp_path / "generating", tmp_path / "hold"
    terminal = Terminal(env, workspace, {"outputs": [answer("never shown")], "generating": str(generating),
                                         "hold_generation": str(hold)})
    try:
        at = started(terminal)
        terminal.type("go")
        wait_for_file(generating)
        at = terminal.expect(STATUS, at)
        os.kill(terminal.process.pid, signal.SIGINT)
        screen = settle(terminal, terminal.expect("[turn interrupted", at))
        notice = line_of(screen, "interrupting the turn")
        assert line_of(screen, "[turn interrupted") > notice
        assert not any(STATUS in line for line in screen), "\n".join(screen)
        assert not any("never shown" in line for line in screen)
    finally:
        close(terminal)


def test_a_resize_while_the_model_works_keeps_the_answer_and_the_status_line_within_the_width(
        env, home, workspace, tmp_path) -> None:
    """The window narrows while the status line is drawn: the status line is redrawn within the new width (never
    wrapping onto a second line), and the answer then streamed stays whole."""
    generating, hold = tmp_path / "generating", tmp_path / "hold"
    words = "the answer after the resize"
    terminal = Terminal(env, workspace, {"outputs": [answer(words)], "generating": str(generating),
                                         "hold_generation": str(hold), "linger_s": 0.6}, columns=120)
    try:
        at = started(terminal)
        terminal.type("go")
        wait_for_file(generating)
        at = terminal.expect(STATUS, at)
        terminal.resize(40, 60)
        time.sleep(0.6)
        drawn = [line for line in terminal.display() if "round 1" in line]
        assert len(drawn) == 1 and len(drawn[0]) <= 40, "\n".join(terminal.display())
        hold.touch()
        screen = settle(terminal, terminal.expect(words, at))
        assert screen[line_of(screen, words)] == words, "\n".join(screen)
        assert not any(STATUS[:12] in line for line in screen), "\n".join(screen)
    finally:
        close(terminal)
