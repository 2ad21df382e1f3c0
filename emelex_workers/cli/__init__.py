"""The `emelex` command line (typer). Errors print one line and exit non-zero, never a traceback."""

from __future__ import annotations

import apsw
import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from emelex_memory import EmelexError, Settings

from .memory import memory_app
from .models import models_app
from .plugins import plugins_app


class _OneLineErrors(TyperGroup):
    """Root group that turns every expected failure into one line on stderr and exit status 1."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except EmelexError as exc:
            message = str(exc)
        except ValidationError as exc:
            first = exc.errors()[0]
            message = f"invalid setting {'.'.join(map(str, first['loc']))}: {first['msg']}; fix EMELEX_* or config.toml"
        except apsw.Error as exc:
            message = f"database error: {exc}; run `emelex memory doctor`"
        except OSError as exc:  # a last resort: the library raises file failures as typed errors (io_errors)
            message = f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        typer.echo(f"error: {message}", err=True)
        ctx.exit(1)


app = typer.Typer(
    cls=_OneLineErrors,
    name="emelex",
    help="Emelex: durable local memory for a local-LLM agent.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(memory_app, name="memory")
app.add_typer(models_app, name="models")
app.add_typer(plugins_app, name="plugins")


@app.callback()
def _root(ctx: typer.Context) -> None:
    """Emelex: durable local memory for a local-LLM agent. Settings come from EMELEX_* and <home>/config.toml."""
    ctx.obj = ctx.obj or Settings()


def main() -> None:
    """Console-script entry point."""
    app()
