"""Start-up: `emelex --help` and `emelex memory work` on an empty queue against importing our dependencies alone.

Each probe is a fresh interpreter, timed from spawn to exit:

- deps: `python -c "import apsw, pluggy, pydantic_settings, typer"`, the baseline;
- help: `emelex --help`;
- work: `emelex memory work` on a store with an empty queue;
- core: `python -c "from emelex_memory import MemoryStore"` (the package itself imports its modules lazily), and
  core-deps: `python -c "import apsw, pydantic_settings"`, whose
  difference is the storage core's own import, the share of `work` the CLI cannot make lazy.

Every probe runs with bytecode caching on (`PYTHONPYCACHEPREFIX` in the benchmark's temporary folder, written
by the warm-up run), as for an installed package, whose modules pip compiles: a shell that sets
`PYTHONDONTWRITEBYTECODE` would otherwise compile our modules on every run but not the dependencies'.

The probes run in rounds, one of each per round in a rotating order, so the machine's load hits all alike;
each figure is the median over the rounds, and a ratio is the median of the per-round ratios. Writes the
`startup` section of benchmarks/RESULTS.md (target: each ratio at most 1.3).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import met, publish, verdict

from emelex_memory import MemoryStore, Settings

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "21"))
TARGET = 1.3
SECTIONS = ("startup",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_workers/cli",
    "emelex_workers/worker",
    "emelex_workers/settings.py",
    "emelex_memory/__init__.py",
    "emelex_memory/store.py",
    "emelex_memory/core",
    "emelex_memory/queue",
)
CLI = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
PROBES = {
    "deps": [sys.executable, "-c", "import apsw, pluggy, pydantic_settings, typer"],
    "help": [*CLI, "--help"],
    "work": [*CLI, "memory", "work"],
    "core": [sys.executable, "-c", "from emelex_memory import MemoryStore"],
    "core-deps": [sys.executable, "-c", "import apsw, pydantic_settings"],
}


def _run(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(home: Path) -> dict[str, list[float]]:
    """Seconds per probe and round, the probes alternating within each round."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["EMELEX_HOME"] = str(home)
    env["PYTHONPYCACHEPREFIX"] = str(home.parent / "pycache")  # bytecode for every module, as an install has
    MemoryStore.open(Settings(home=home)).close()
    names = list(PROBES)
    for name in names:  # warm the OS caches and the bytecode
        _run(PROBES[name], env)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(ROUNDS):
        for name in names[i % len(names):] + names[: i % len(names)]:
            times[name].append(_run(PROBES[name], env))
    return times


def figures_of(times: dict[str, list[float]]) -> dict:
    """The recorded figures: each probe's median in ms, and the two commands' median ratios to the baseline."""
    return {"rounds": len(times["deps"]), "ms": {name: statistics.median(t) * 1000 for name, t in times.items()},
            "ratio": {name: statistics.median(a / b for a, b in zip(times[name], times["deps"]))
                      for name in ("help", "work")}}


def render(figures: dict) -> str:
    """The `startup` section of the recorded `figures`: the medians, the two ratios and the core's share."""
    ms, ratio = figures["ms"], figures["ratio"]
    core_own = ms["core"] - ms["core-deps"]
    beyond = ms["work"] - ms["deps"]
    share = (f"about {100 * core_own / beyond:.0f}% of what the command costs beyond the baseline ({beyond:.0f} ms)"
             if beyond > 0 else f"while the command costs no more than the baseline ({beyond:.0f} ms)")
    return f"""## Start-up (`bench_startup.py`)

Measured {figures['measured']}. Each probe a fresh interpreter, spawn to exit, {figures['rounds']} rounds alternating the probes; medians;
bytecode cached for every module, as for an installed package. Baseline:
`python -c "import apsw, pluggy, pydantic_settings, typer"`. Produced by `python benchmarks/bench_startup.py`.

| probe | time | ratio to the baseline | target |
| --- | --- | --- | --- |
| dependencies alone (baseline) | {ms['deps']:.0f} ms | 1 | |
| `emelex --help` | {ms['help']:.0f} ms | {ratio['help']:.2f} | {verdict(ratio['help'], '<=', TARGET)} |
| `emelex memory work`, empty queue | {ms['work']:.0f} ms | {ratio['work']:.2f} | {verdict(ratio['work'], '<=', TARGET)} |

Of `emelex memory work`, the storage core's own import (`from emelex_memory import MemoryStore`, {ms['core']:.0f} ms, less
`import apsw, pydantic_settings`, {ms['core-deps']:.0f} ms) is {core_own:.0f} ms,
{share}. The command line imports a command's module only when it runs
(`emelex --help` imports no storage, plugin or model code); an idle worker imports neither the plugin
manager nor the model layer.
"""


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="emelex-bench-startup-") as tmp:
        figures = figures_of(measure(Path(tmp) / "home"))
    print(publish("startup", render, figures))
    return 0 if all(met(r, "<=", TARGET) for r in figures["ratio"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
