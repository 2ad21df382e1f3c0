"""The `emelex` command line (typer). Errors print one line (or one JSON object) and exit non-zero, never a traceback.

Exit status: 0 on success, 1 for an error, 2 for a usage error (an unknown
option, a missing argument, a value out of range), 141 when stdout was closed
early (`emelex memory doctor | head -1`), as if killed by SIGPIPE; commands
document their own further codes (`emelex memory work`: 3 and 128+N).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Annotated, Any

import typer

from .common import (
    optional_resume,
    EXIT_ERROR,
    EXIT_USAGE,
    Abort,
    EmelexTyper,
    Lazy,
    LazyGroup,
    NoArgsIsHelpError,
    UsageError,
    error_text,
    json_requested,
    usage_error_text,
)

EXIT_PIPE_CLOSED = 128 + 13  # 128 + SIGPIPE: what a shell reports for a writer killed by a closed pipe
DISTRIBUTION = "emelex-memory"


class StdoutClosed(BaseException):  # noqa: N818 - like SystemExit, a way out rather than an error
    """Raised when the reader of stdout went away (a closed pipe): `main` exits quietly with status 141."""


class _Root(LazyGroup):
    """Root group: every expected failure becomes one line (or one JSON object under `--json`) on stderr with its
    exit status, whichever subcommand raised it. Its groups are imported when used (`emelex --help` imports none)."""

    json_errors = False
    lazy_commands = {
        "memory": Lazy("emelex_workers.cli.memory:memory_app", "Inspect and maintain the memory store."),
        "models": Lazy("emelex_workers.cli.models:models_app", "Install, list, verify and remove local GGUF models, and add served ones."),
        "plugins": Lazy("emelex_workers.cli.plugins:plugins_app", "Inspect the plugins Emelex loads."),
        "config": Lazy("emelex_workers.cli.config:config_app", "Show the effective settings and where each came from."),
        "mcp": Lazy("emelex_workers.cli.mcp:mcp", "Serve the workspace's memory (search, recall, Knowledge, Sessions) to an "
                    "MCP client over stdio; needs the `mcp` extra."),
        "chat": Lazy("emelex_workers.cli.chat:chat", "Chat with the local model and its tools in a durable Session (new, "
                     "--continue the latest, or --resume one)."),
    }

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        """Run the command line; in standalone mode, print usage errors as one line and exit with the status."""
        args = optional_resume(list(sys.argv[1:] if args is None else args))
        self.json_errors = json_requested(args)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as exc:
            if NoArgsIsHelpError is not None and isinstance(exc, NoArgsIsHelpError):
                typer.echo(exc.format_message())  # a group given no command: its help, as `--help` prints it
                sys.exit(0)
            typer.echo(usage_error_text(exc, self.json_errors), err=True)
            sys.exit(EXIT_USAGE)
        except Abort:
            typer.echo(error_text("Aborted", "aborted; nothing was changed", self.json_errors), err=True)
            sys.exit(EXIT_ERROR)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: typer.Context) -> Any:
        """Invoke the subcommand, turning its expected failures into one line (or JSON object) and exit status 1."""
        import apsw  # imported here, with the storage core, only once a command runs
        from pydantic import ValidationError

        from emelex_memory import EmelexError

        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise StdoutClosed from None
        except EmelexError as exc:
            kind, message = type(exc).__name__, str(exc)
        except ValidationError as exc:
            from emelex_memory.core.settings import source_of

            first = exc.errors()[0]
            kind, name = type(exc).__name__, ".".join(map(str, first["loc"]))
            source = source_of(name) if first["loc"] else None
            where = f" (from {source.where})" if source is not None and source.where else ""
            message = f"invalid setting {name}{where}: {first['msg']}; fix EMELEX_* or config.toml"
        except apsw.Error as exc:
            kind, message = type(exc).__name__, f"database error: {exc}; run `emelex memory doctor`"
        except OSError as exc:  # a last resort: the library raises file failures as typed errors (io_errors)
            kind, message = type(exc).__name__, f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        typer.echo(error_text(kind, message, self.json_errors), err=True)
        ctx.exit(EXIT_ERROR)


app = EmelexTyper(
    cls=_Root,
    name="emelex",
    help="Emelex: durable local memory for a local-LLM agent. First step: `emelex models install --default` "
         "(the embedded model), then `emelex chat` in your project's directory.",
    pretty_exceptions_enable=False,
    add_completion=False,
)


def version() -> str:
    """The installed version of the emelex-memory distribution ("unknown" when it is not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"emelex {version()}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_show_version, help="Print the version and exit.",
    )] = False,
) -> None:
    """Emelex: durable local memory for a local-LLM agent. Settings come from EMELEX_* and <home>/config.toml."""
    from emelex_memory.core.settings import unknown_environment

    from ..settings import WorkerSettings

    ctx.obj = ctx.obj or WorkerSettings()
    if ctx.invoked_subcommand == "config":  # `config show` lists unknown variables itself
        return
    for name, nearest in unknown_environment(WorkerSettings):
        if nearest is not None:  # a near miss is a typo; a variable far from every setting is another tool's
            typer.echo(f"warning: {name} is not a setting and is ignored; did you mean {nearest}?", err=True)


def main() -> None:
    """Console-script entry point: run the command line; a closed stdout ends it quietly with status 141."""
    try:
        try:
            app(prog_name="emelex")
        finally:
            sys.stdout.flush()
    except (BrokenPipeError, StdoutClosed):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush at exit then has somewhere to go
        sys.exit(EXIT_PIPE_CLOSED)
