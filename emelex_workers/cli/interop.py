"""`emelex memory import` and `emelex memory export`: other agents' histories in, the store out and back in.

Import reads Claude Code session files, Codex rollout files, OpenAI Agents SDK session databases, Emelex's generic
JSON Lines history, and Emelex exports (see docs/interop.md). Each source is imported on its own: what is refused is
reported and the rest goes on; the command exits 1 when anything was refused.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import EXIT_ERROR, JsonFlag, echo_json, given_path, one_of, settings_of

FORMAT_HELP = "auto (told by the first lines), claude-code, codex, agents-sdk or jsonl (Emelex's generic history)."
PREFIX = 8


def _pair(value: str) -> tuple[str, str]:
    old, sep, new = value.partition("=")
    if not sep or not old.strip() or not new.strip():
        raise typer.BadParameter(f"{value!r} is not OLD=NEW (a directory the export names, '=', the one to use here)")
    return os.path.abspath(old), os.path.abspath(new)


class _Status:
    """Progress as one status line on stderr, drawn only when it is a terminal, erased when done."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.drawn = enabled, False

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.enabled:
            sys.stderr.write(f"\r{what}: {done} of {total}\x1b[K")
            sys.stderr.flush()
            self.drawn = True

    def end(self) -> None:
        """Erase the line, if drawn."""
        if self.drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.drawn = False


def _line(result) -> str:
    if result.outcome in ("refused", "skipped"):  # a message that begins with the file names it already
        told = result.message if result.message.startswith(result.path) else f"{result.path}: {result.message}"
        return f"{result.outcome:<10} {told}"
    if result.outcome == "unchanged":
        why = result.message or "nothing new since its last import"
        session = f" (Session {result.session_id[:PREFIX]})" if result.session_id else ""
        return f"unchanged  {result.path}{session}: {why}"
    lines = f"line {result.first_line}" if result.first_line == result.last_line else \
        f"lines {result.first_line}-{result.last_line}"
    notes = [lines, _n(result.events, "event")]
    if result.skipped:
        notes.append(f"{_n(result.skipped, 'line')} skipped (not conversation)")
    if result.cut:
        notes.append(f"{result.cut} cut to the size cap")
    if result.job_id:
        notes.append("distillation queued")
    new = "new Session" if result.created else "Session"
    return f"imported   {result.path} -> {new} {result.session_id[:PREFIX]} ({result.format}): {', '.join(notes)}"


def import_histories(
    ctx: typer.Context,
    paths: Annotated[list[str], typer.Argument(metavar="PATH...", show_default=False, help=(
        "History files, folders of them (every *.jsonl below, e.g. ~/.claude/projects or ~/.codex/sessions), an "
        "Agents SDK database, or an Emelex export."))],
    format: Annotated[str, typer.Option("--format", metavar="FORMAT", callback=one_of(
        "auto", "claude-code", "codex", "agents-sdk", "jsonl"), help=FORMAT_HELP)] = "auto",
    workspace: Annotated[Optional[Path], typer.Option(
        "--workspace", "-w", metavar="DIR", parser=given_path, show_default=False,
        help="Import into this directory instead of the one each history names (required where none is named).",
    )] = None,
    mapping: Annotated[Optional[list[str]], typer.Option(
        "--map", metavar="OLD=NEW", show_default=False,
        help="For an export: the directory OLD it names is NEW here (repeatable).")] = None,
    skip_damaged: Annotated[bool, typer.Option(
        "--skip-damaged", help="Skip lines that do not parse (counted) instead of refusing their file.")] = False,
    new_workspace: Annotated[bool, typer.Option(
        "--new-workspace", help="A directory where another known workspace was (a re-clone) is a new workspace.",
    )] = False,
    as_json: JsonFlag = False,
) -> None:
    """Import other agents' histories as Sessions (with their source, digest and lines), queued for distillation;
    re-importing is a no-op and a grown file adds only what is new. Also reads an Emelex export back."""
    from emelex_memory import EmelexError, MemoryStore

    from ..interop.events import SourceResult
    from ..interop.export_file import import_export
    from ..interop.importer import ImportOptions, import_source, sources

    pairs = [_pair(m) for m in mapping or []]
    options = ImportOptions(format, None if workspace is None else str(workspace.resolve()), skip_damaged,
                            new_workspace)
    terminal = sys.stderr.isatty() and not as_json
    results, restored = [], []
    listed: list[tuple[str, list[str], list]] = []
    for given in paths:  # what each path names, before anything (a store, too) is created
        try:
            listed.append((given, sources(given), []))
        except EmelexError as exc:
            listed.append((given, [], [SourceResult(os.path.abspath(given), format, "refused", str(exc))]))
    for given, files, found in listed:
        if not files and not found:
            found.append(SourceResult(os.path.abspath(given), format, "refused", "no *.jsonl history files in it"))
    if not any(files for _, files, _ in listed):
        for _, _, found in listed:
            results += found
        return _report(results, [], as_json)
    with MemoryStore.open(settings_of(ctx)) as store:
        def restore(store_: MemoryStore, path: str) -> list:
            status = _Status(terminal)
            try:
                restored.append(import_export(store_, path, mapping=pairs, workspace=options.workspace,
                                              progress=status))
            finally:
                status.end()
            return []

        for given, files, found in listed:
            walked = os.path.isdir(given)
            for path in files:
                found += import_source(store, path, options, restore, walked=walked)
            for result in found:
                results.append(result)
                if not as_json:
                    typer.echo(_line(result))
    _report(results, restored, as_json, echoed=True)


def _report(results: list, restored: list, as_json: bool, *, echoed: bool = False) -> None:
    """Print what the import did (the sources' lines unless `echoed` already) and exit 1 when anything was
    refused."""
    if not as_json and not echoed:
        for result in results:
            typer.echo(_line(result))
    refused = sum(r.outcome == "refused" for r in results) + sum(r.refused_count for r in restored)
    if as_json:
        echo_json("imported", {
            "sources": [r.__dict__ for r in results],
            "exports": [{"path": r.path, "imported": r.imported, "unchanged": r.unchanged, "refused": r.refused,
                         "refused_count": r.refused_count} for r in restored],
        })
    else:
        for report in restored:
            i, u = report.imported, report.unchanged
            typer.echo(f"export     {report.path}: imported {_n(i['sessions'], 'Session')}, "
                       f"{_n(i['knowledge'], 'Knowledge entry', 'Knowledge entries')}, {_n(i['assets'], 'asset')}; "
                       f"already here: {_n(u['sessions'], 'Session')}, {_n(u['knowledge'], 'entry', 'entries')}")
            for message in report.refused:
                typer.echo(f"refused    {message}")
            if report.refused_count > len(report.refused):
                typer.echo(f"refused    ... and {report.refused_count - len(report.refused)} more")
        if refused:
            rest = "; the rest was imported" if any(r.outcome != "refused" for r in results) or any(
                sum(r.imported.values()) for r in restored) else ""
            typer.echo(f"{refused} refused: nothing of {'it' if refused == 1 else 'those'} was written{rest}",
                       err=True)
    if refused:
        raise typer.Exit(EXIT_ERROR)


def export(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(metavar="FILE", parser=given_path, show_default=False, help=(
        "The new file to write (JSON Lines, mode 0600); never overwritten."))],
    as_json: JsonFlag = False,
) -> None:
    """Export every Session (events, Summaries and their provenance, assets) and all Knowledge (every version,
    tombstones, pins) to FILE, which `emelex memory import FILE` reads back into any Home."""
    from ..interop.export_file import write_export
    from .common import open_store

    status = _Status(sys.stderr.isatty() and not as_json)
    with open_store(ctx) as store:
        try:
            report = write_export(store, str(path), status)
        finally:
            status.end()
    c = report.counts
    if as_json:
        echo_json("exported", {"path": str(path), "counts": c, "lines": report.lines})
        return
    typer.echo(f"exported {_n(c['sessions'], 'Session')} ({_n(c['events'], 'event')}), "
               f"{_n(c['knowledge'], 'Knowledge entry', 'Knowledge entries')} and {_n(c['assets'], 'asset')} to {path} "
               f"({_n(report.lines, 'line')})")


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"
