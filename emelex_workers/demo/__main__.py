"""`python -m emelex_workers.demo WORKSPACE`: the demo behind `make demo` (see `memory.main`)."""

import sys

from .memory import main

main(sys.argv[1:])
