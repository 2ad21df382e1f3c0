"""The `emelex` console script. It imports the command line (`emelex_workers.cli`) only inside `main`, so that a
Ctrl-C pressed while Python still imports it (a fraction of a second, longer on a busy machine) ends the command
with one line and status 130, as one pressed later does, instead of a `KeyboardInterrupt` traceback."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 128 + 2  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C


def main() -> None:
    """Run the command line (`emelex_workers.cli.main`); a Ctrl-C that reaches this far ends it with one line on
    stderr and status 130."""
    try:
        from .cli import main as run

        run()
    except KeyboardInterrupt:
        sys.stderr.write("\nemelex: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
