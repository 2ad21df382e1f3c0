"""What every `emelex` command shares: plain `--help` with placeholders, errors as one line or one JSON object,
the common arguments and options, timestamps, and printing one page of a paged listing.

Help is rendered the same way whatever typer and rich versions are
installed: `Usage: emelex memory sessions show [OPTIONS] SESSION`, then the
arguments and options with their placeholders (`SESSION`, `--after SEQ`),
never their Python types. Errors go to stderr as `error: <message>` (exit 1;
a usage error adds at most a one-line `try '... --help'` hint and exits 2),
or, when `--json` was given, as `{"error": {"type": ..., "message": ...}}`
with the same exit status.
"""

from __future__ import annotations

import difflib
import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, NamedTuple, Optional, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from emelex_memory import MemoryStore

    from ..settings import WorkerSettings

EXIT_ERROR = 1
EXIT_USAGE = 2

# click's usage errors, from click itself or from the copy that newer typer releases vendor (typer.Abort is theirs)
CLICK_EXCEPTIONS = sys.modules[typer.BadParameter.__module__]
UsageError: type[Exception] = CLICK_EXCEPTIONS.UsageError
Abort: type[BaseException] = typer.Abort
NoArgsIsHelpError: type[Exception] | None = getattr(CLICK_EXCEPTIONS, "NoArgsIsHelpError", None)

T = TypeVar("T")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for machines (errors too, on stderr).")]
SessionArg = Annotated[str, typer.Argument(
    metavar="SESSION", help="Session ID, or a unique prefix of it (at least 4 characters).", show_default=False,
)]
CursorOpt = Annotated[Optional[str], typer.Option(metavar="CURSOR", help="next_cursor printed by the previous page.")]


def given_path(value: str | Path) -> Path:
    """A path argument as typed: an empty or blank one is a usage error (it would silently mean the current
    directory); "." says that."""
    if isinstance(value, str) and not value.strip():
        raise typer.BadParameter("an empty path names no directory; give one (\".\" for the current directory)")
    return Path(value)


WorkspaceOpt = Annotated[Path, typer.Option(
    "--workspace", "-w", metavar="DIR", show_default=False, parser=given_path,
    help="Workspace directory (default: current).")]


def when(ts: float | None, missing: str = "-") -> str:
    """A timestamp as local `YYYY-MM-DD HH:MM:SS`, or `missing` when there is none."""
    return missing if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def settings_of(ctx: typer.Context) -> WorkerSettings:
    """The `WorkerSettings` the root command built for this invocation."""
    return ctx.find_root().obj


def open_store(ctx: typer.Context) -> MemoryStore:
    """The existing store of this invocation's Home, opened (never created: `NoStoreError` when there is none); use
    it as a context manager."""
    from emelex_memory import MemoryStore  # imported here: `emelex --help` does not load the storage core

    return MemoryStore.open(settings_of(ctx), create=False)


def read_listing(ctx: typer.Context, read: Callable[[MemoryStore], T], nothing: T) -> T:
    """What `read` gives of the existing store of this invocation's Home, or `nothing` on a Home without a store yet
    (a new Home lists nothing, and nothing is created to say so)."""
    from emelex_memory import NoStoreError

    try:
        with open_store(ctx) as store:
            return read(store)
    except NoStoreError:
        return nothing


def page_limit(ctx: typer.Context, value: int | None) -> int | None:
    """Option callback: a page size between 1 and the `max_page_items` setting, else a usage error naming the flag."""
    if value is not None and not 1 <= value <= settings_of(ctx).max_page_items:
        raise typer.BadParameter(f"must be between 1 and {settings_of(ctx).max_page_items}, got {value}")
    return value


def one_of(*choices: str):
    """An option callback accepting only `choices` (or no value), else a usage error naming the flag."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    return check


def known_kind(value: str | None) -> str | None:
    """Option callback: a registered job kind (or no value), else a usage error naming the flag and the kinds."""
    from emelex_memory import registered_kinds  # here: importing the CLI must not import the core

    kinds = registered_kinds()
    if value is not None and value not in kinds:
        raise typer.BadParameter(f"must be one of {', '.join(kinds)}, got {value!r}")
    return value


def share(value: float) -> float:
    """Option callback: a share of the context window, in (0, 1], else a usage error naming the flag."""
    if not 0 < value <= 1:
        raise typer.BadParameter(f"must be a number in (0, 1], got {value}")
    return value


def usage_error(ctx: typer.Context, message: str) -> Exception:
    """A usage error (exit 2, with the `--help` hint of `ctx`'s command) for a combination of arguments: raise what
    this returns."""
    return UsageError(message, ctx)


def json_requested(args: Sequence[str]) -> bool:
    """True when `--json` is among the options of a command line (before any `--`)."""
    args = list(args)
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def error_text(kind: str, message: str, as_json: bool) -> str:
    """An error as printed on stderr: `error: <message>`, or `{"error": {"type": kind, "message": ...}}`."""
    if as_json:
        return json.dumps({"error": {"type": kind, "message": message}})
    return f"error: {message}"


def echo_json(outcome: str, data: dict[str, Any]) -> None:
    """Print one JSON object on stdout: `{"outcome": outcome, **data}`."""
    typer.echo(json.dumps({"outcome": outcome, **data}, default=str))


def echo_page(
    name: str,
    items: Sequence[T],
    next_cursor: str | None,
    as_json: bool,
    *,
    as_dict: Callable[[T], dict],
    line: Callable[[T], str],
    empty: str,
    header: str = "",
) -> None:
    """Print a page: with `as_json` one JSON object `{"outcome": "listed", name: [as_dict(item)...],
    "next_cursor": ...}`; otherwise `header` (column labels, when given and there are items), `line(item)` for
    each item, `empty` when there are none, and the `--cursor` to pass for the next page."""
    if as_json:
        echo_json("listed", {name: [as_dict(i) for i in items], "next_cursor": next_cursor})
        return
    if header and items:
        typer.echo(header)
    for item in items:
        typer.echo(line(item))
    if not items:
        typer.echo(empty)
    if next_cursor:
        typer.echo(f"more: --cursor {next_cursor}")


def usage_error_text(exc: Exception, as_json: bool) -> str:
    """A click usage error as one line (plus a one-line hint naming the command's `--help`), or its JSON object."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    unknown = re.fullmatch(r"No such command '(.+)'\.", message)
    if unknown and ctx is not None and callable(getattr(ctx.command, "list_commands", None)):
        near = difflib.get_close_matches(unknown.group(1), ctx.command.list_commands(ctx), n=1, cutoff=0.6)
        message += f" Did you mean '{near[0]}'?" if near else ""
    if as_json:
        return error_text(type(exc).__name__, message, True)
    hint = f"\ntry '{ctx.command_path} --help'" if ctx is not None else ""
    return f"error: {message}{hint}"


def _placeholder(param: Any) -> str:
    return param.metavar or param.name.upper()


def _default_note(param: Any) -> str:
    default = param.default
    if param.is_flag or default is None or param.show_default is False or callable(default):
        return ""
    return f"  [default: {default}]"


class PlainHelp:
    """Help text in click's plain layout with placeholders instead of types; mixed into commands and groups."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """`[OPTIONS]`, then each argument's placeholder (`[PATH]` when optional), then `COMMAND [ARGS]...` for a
        group."""
        pieces = ["[OPTIONS]"]
        for param in self.get_params(ctx):
            if param.param_type_name == "argument" and not param.hidden:
                name = _placeholder(param)
                pieces.append(name if param.required else f"[{name}]")
        if isinstance(self, TyperGroup):
            pieces.append("COMMAND [ARGS]...")
        return pieces

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Usage, description, arguments, options and (for a group) its commands."""
        formatter.write_usage(ctx.command_path, " ".join(self.collect_usage_pieces(ctx)))
        self.format_help_text(ctx, formatter)
        self.format_options(ctx, formatter)
        self.format_epilog(ctx, formatter)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """The Arguments and Options sections (and a group's Commands)."""
        arguments, options = [], []
        for param in self.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            help_text = " ".join((getattr(param, "help", None) or "").split())
            if param.param_type_name == "argument":
                arguments.append((_placeholder(param), help_text))
                continue
            names = ", ".join(param.opts) + "".join(f" / {o}" for o in param.secondary_opts)
            if not param.is_flag:
                names += f" {_placeholder(param)}"
            options.append((names, help_text + _default_note(param)))
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)
        if isinstance(self, TyperGroup):
            self.format_commands(ctx, formatter)


class EmelexCommand(PlainHelp, TyperCommand):
    """Every `emelex` command: plain help."""


class EmelexGroup(PlainHelp, TyperGroup):
    """Every `emelex` command group: plain help."""


class Lazy(NamedTuple):
    """A subcommand imported only when it runs or its own help is asked for: `target` is "module:attribute", a
    `typer.Typer` (a group) or a command function; `help` is the first paragraph of its help, which the parent's
    `--help` lists without importing it (a test checks the two agree)."""

    target: str
    help: str


class LazyGroup(EmelexGroup):
    """A command group whose subcommands in `lazy_commands` (name: `Lazy`, in listing order) are imported on first
    use, so a command pays only for the modules it runs; they are listed after any registered directly."""

    lazy_commands: ClassVar[dict[str, Lazy]] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        """The registered subcommands, then the lazy ones not yet loaded."""
        return [*super().list_commands(ctx), *(n for n in self.lazy_commands if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The subcommand `cmd_name`, importing it first when it is lazy."""
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            self.add_command(load_command(cmd_name, self.lazy_commands[cmd_name].target), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The Commands section, as click writes it, taking a lazy subcommand's help from its `Lazy` entry."""
        rows = [(name, self.command_summary(ctx, name)) for name in self.list_commands(ctx)]
        rows = [(name, cmd) for name, cmd in rows if cmd is not None and not cmd.hidden]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])

    def command_summary(self, ctx: Any, name: str) -> Any:
        """The subcommand `name` if it is loaded, else a stand-in carrying its `Lazy` help (nothing is imported)."""
        if name in self.commands or name not in self.lazy_commands:
            return super().get_command(ctx, name)
        return EmelexCommand(name=name, help=self.lazy_commands[name].help)


def load_command(name: str, target: str) -> Any:
    """Import `target` ("module:attribute") and make it the click command `name`: a `typer.Typer` becomes a group,
    a function a command."""
    module, _, attribute = target.partition(":")
    obj = getattr(importlib.import_module(module), attribute)
    if isinstance(obj, typer.Typer):
        command = typer.main.get_group(obj)
    else:
        single = EmelexTyper()
        single.command(name)(obj)
        command = typer.main.get_command(single)
    command.name = name
    return command


class EmelexTyper(typer.Typer):
    """A `typer.Typer` whose groups and commands print plain help; groups show their help when given no command."""

    def __init__(self, **kwargs: Any) -> None:
        """As `typer.Typer`, defaulting `cls` to `EmelexGroup`, `no_args_is_help` to True and `add_completion` to
        False."""
        kwargs.setdefault("cls", EmelexGroup)
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("add_completion", False)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls: type | None = None, **kwargs: Any) -> Any:
        """As `typer.Typer.command`, defaulting `cls` to `EmelexCommand`."""
        return super().command(name, cls=cls or EmelexCommand, **kwargs)


CHOOSE = ""  # the value a bare `emelex chat --resume` stands for: choose from a list


def optional_resume(args: list[str]) -> list[str]:
    """The command line with a bare `--resume` of `emelex chat` (the last word, or followed by an option) given the
    value `CHOOSE`, so that it chooses from a list."""
    if "chat" not in args:
        return args
    out = list(args)
    for index in range(args.index("chat") + 1, len(args)):
        following = args[index + 1] if index + 1 < len(args) else None
        if args[index] == "--resume" and (following is None or following.startswith("-")):
            out[index] = f"--resume={CHOOSE}"
    return out


class SaidAtOnce:
    """Lines said from a signal handler, at once, on the terminal or file stderr was when this was made: the handler
    may run while llama.cpp's loading points stderr at /dev/null (llama-cpp-python silences its loader so), inside a
    llama.cpp callback, or while stderr is being written, so nothing here may raise, and a line goes through a live
    display (`live`, a rich console) only while stderr is still what it was. A stderr that is no file (a test's
    capture) is written to as it is. `close()` when done."""

    def __init__(self, live=None) -> None:
        """Say on (a duplicate of) stderr as it is now; `live`: the live display's rich console, while it shows."""
        try:
            self.fd: int | None = os.dup(sys.stderr.fileno())
        except (OSError, ValueError):  # io.UnsupportedOperation is a ValueError: stderr is no file
            self.fd = None
        self.live = live

    def __call__(self, text: str, *, raw: bool = False) -> None:
        """Say `text`; `raw`: straight to the file, never through the live display (whose buffer the handler may
        have interrupted: for a process about to end)."""
        try:
            if self.fd is None:
                print(text, file=sys.stderr, flush=True)
                return
            same = os.path.samestat(os.fstat(self.fd), os.fstat(sys.stderr.fileno()))
            if self.live is not None and same and not raw:
                self.live.print(text, markup=False, highlight=False)
                return
        except BaseException:  # noqa: BLE001 - a handler must not raise where it interrupted
            if self.fd is None:
                return
        try:
            os.write(self.fd, f"\n{text}\n".encode())
        except OSError:
            pass

    def close(self) -> None:
        """Close the duplicate of stderr."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
