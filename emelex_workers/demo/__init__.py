"""The drivers behind `make demo` (`python -m emelex_workers.demo WORKSPACE`): `memory` seeds a store and runs
compaction and distillation through the `emelex` CLI, then `chat` drives `emelex chat` in a subprocess.

The top floor with the CLI: imports emelex_memory and `emelex_workers.cli`; nothing imports it.
"""
