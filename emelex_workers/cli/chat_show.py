"""How `emelex chat` shows a turn as it happens: the proposed call, then its outcome with a bounded preview; on a
terminal a status line while the model works; and the line that ends every turn.

The outcome of a call that ran is shown once the adapter journaled its
result (`on_result`), so a result that could not be recorded is never shown
as "ok"; denied and aborted calls are shown by the approval prompt, refused
ones when they are proposed.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any, TextIO

from emelex_workers.agent.protocol import ProposedCall
from emelex_workers.agent.tools import ToolInvocation, bounded
from emelex_workers.host.types import GenerationProgress

ARGUMENTS_BYTES = 200
PREVIEW_BYTES = 300
PREVIEW_LINES = 4


def call_text(call: ProposedCall) -> str:
    """One call as "tool {arguments}" (arguments bounded)."""
    return f"{call.tool} {bounded(json.dumps(call.arguments, ensure_ascii=False), ARGUMENTS_BYTES)}"


def approval_text(call: ProposedCall, tool: Any, workspace: Path) -> str:
    """What an approval prompt shows of `call` (of registered tool `tool`): the tool's preview of what it would do
    (`ToolSpec.preview`: a file change's diff, a command and its directory), else, or when the preview fails, the
    call as "tool {arguments}"."""
    preview_of = getattr(getattr(tool, "spec", None), "preview", None)
    if preview_of is not None:
        try:
            return str(preview_of(ToolInvocation("preview", call.tool, dict(call.arguments), Path(workspace))))
        except Exception:  # a preview only informs: the call's arguments say the rest
            pass
    return call_text(call)


def call_line(call: ProposedCall) -> str:
    """One proposed call as a line: "-> tool {arguments}"."""
    return f"-> {call_text(call)}"


def preview(text: str | dict) -> str:
    """A tool output cut to `PREVIEW_LINES` lines and `PREVIEW_BYTES` bytes, each line indented; "(no output)"
    when empty."""
    body = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    lines = body.rstrip("\n").splitlines() or ["(no output)"]
    shown = lines[:PREVIEW_LINES] + ([f"... ({len(lines) - PREVIEW_LINES} more lines)"]
                                     if len(lines) > PREVIEW_LINES else [])
    return "\n".join(f"     {bounded(line, PREVIEW_BYTES)}" for line in shown)


def outcome_lines(tool: str, outcome: str, output: str | dict) -> str:
    """The outcome of one call: "<- tool: outcome" and the output preview."""
    return f"<- {tool}: {outcome}\n{preview(output)}"


SPINNER = "|/-\\"
ERASE_LINE = "\r\x1b[K"  # to the line's start, then erase to its end


def plural(count: int, noun: str) -> str:
    """"1 round", "2 rounds"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


class TrackedOutput(io.TextIOBase):
    """A text stream that passes everything written to `stream` and remembers whether the cursor is at the start of
    an empty line (`at_line_start`: nothing written yet, or the last text written ended a line), so that a status
    line is drawn only where it cannot cover what was said."""

    def __init__(self, stream: TextIO) -> None:
        """Track what is written to `stream`."""
        self.stream = stream
        self.at_line_start = True

    def write(self, text: str) -> int:
        """Write `text` to the stream; a non-empty `text` decides `at_line_start`."""
        if text:
            self.at_line_start = text.endswith("\n")
        return self.stream.write(text)

    def flush(self) -> None:
        """Flush the stream."""
        self.stream.flush()

    def fileno(self) -> int:
        """The stream's file descriptor."""
        return self.stream.fileno()

    def isatty(self) -> bool:
        """Whether the stream is a terminal."""
        return self.stream.isatty()

    @property
    def encoding(self) -> str:
        """The stream's encoding."""
        return self.stream.encoding


class StatusLine:
    """One line redrawn in place on a terminal (carriage return, erase to the end of the line), only on an empty
    line (where the cursor of `output` is at a line's start: never over an answer or anything else not yet ended by
    a line break), and erased before anything else is written; `live` False (not a terminal): it writes nothing."""

    def __init__(self, output: TrackedOutput, live: bool) -> None:
        """A status line on `output`, drawn only when `live`."""
        self.output = output
        self.live = live
        self.shown = False

    def show(self, text: str) -> None:
        """Draw `text` (cut to the terminal's width) on the current line when it is empty (or holds only the status
        line); else draw nothing."""
        if not self.live or not (self.shown or self.output.at_line_start):
            return
        width = shutil.get_terminal_size().columns - 1
        self.output.stream.write(ERASE_LINE + text[:max(width, 20)])
        self.output.stream.flush()
        self.shown = True

    def clear(self) -> None:
        """Erase the status line, if drawn, leaving the cursor at the start of the line."""
        if self.shown:
            self.output.stream.write(ERASE_LINE)
            self.output.stream.flush()
            self.shown = False


class TurnProgress:
    """What one turn has done so far: its start, the model round under way, each round's last progress report
    (when the binding reports progress) and the characters streamed in the current round."""

    def __init__(self, started: float) -> None:
        """A turn that started at `started` (`time.monotonic()`)."""
        self.started = started
        self.round = 1
        self.reports: dict[int, GenerationProgress] = {}
        self.characters = 0
        self.frame = 0

    def report(self, round_: int, progress: GenerationProgress) -> None:
        """Take progress report `progress` of model round `round_`."""
        if round_ != self.round:
            self.round, self.characters = round_, 0
        self.reports[round_] = progress

    def streamed(self, piece: str) -> None:
        """Count one streamed piece of the current round."""
        self.characters += len(piece)

    def round_done(self) -> None:
        """The current round's text is complete: what follows belongs to the next round."""
        self.round, self.characters = self.round + 1, 0

    def status(self, now: float) -> str:
        """The status line while the model works: round, what it is doing, the turn's time so far."""
        self.frame += 1
        report = self.reports.get(self.round)
        if report is not None and report.waiting_s is not None:
            doing = f"waiting for the model server: {report.waiting_s:.0f} s"
        elif report is not None and report.evaluated_tokens is not None:
            doing = f"reading the prompt, {report.evaluated_tokens} of {report.prompt_tokens} tokens"
        elif report is not None:
            doing = f"{plural(report.generated_tokens, 'token')} generated"
        elif self.characters:
            doing = f"{plural(self.characters, 'character')} generated"
        else:
            doing = "waiting for the model"
        return (f"{SPINNER[self.frame % len(SPINNER)]} round {self.round}: {doing}, {now - self.started:.1f} s "
                "(Ctrl-C interrupts)")

    def summary(self, result: Any, now: float) -> str:
        """The line that ends turn `result` (a `TurnResult`): its time, rounds, tool calls and, when the binding
        reported them, the prompt and generated tokens of all its rounds."""
        parts = [f"{now - self.started:.1f} s", plural(result.rounds, "round"), plural(result.calls, "tool call")]
        if self.reports:
            prompt = sum(r.prompt_tokens for r in self.reports.values())
            generated = sum(r.generated_tokens for r in self.reports.values())
            parts.append(f"{prompt} prompt + {generated} generated tokens")
        return f"[{', '.join(parts)}]"


FORCED = {"chain_limit": "the model used all of this turn's tool rounds, so it answered from what it had read",
          "repeat": "the last tool calls found nothing new, so the model answered from what it had read"}


def ending_line(result: Any) -> str | None:
    """How turn `result` ended, when it is more than its answer: "[turn OUTCOME: diagnostic]" for a turn without
    an answer, "[limit-forced answer: REASON]" for an answer the adapter forced (`result.forced`, said in words for
    the reasons of `FORCED`; read with getattr, so an adapter without it shows plain answers; an answer forced
    because the turn's results held it, "answered", is a plain answer), else None."""
    if result.outcome != "answer":
        return f"[turn {result.outcome}: {result.diagnostic}]"
    forced = getattr(result, "forced", None)
    if forced and forced != "answered":  # the turn's results held the answer: the ordinary end of a turn
        reason = FORCED.get(forced, forced) if isinstance(forced, str) else None
        return f"[limit-forced answer: {reason}]" if reason else "[limit-forced answer]"
    return None
