"""How many CPU threads the model uses, and why: a report for `doctor` and the worker, not a policy.

The number is the `model_threads` setting, whatever the machine; this module
only says where that value came from, how many CPUs this process may run on
(`os.sched_getaffinity`, where the platform has it) and whether the load
average shows those CPUs already busy, when generation gets many times slower.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from emelex_memory import Settings


@dataclass(frozen=True)
class ThreadAdvice:
    """`threads` (the `model_threads` setting) and `source` (where it came from: "default", "file ...",
    "environment EMELEX_MODEL_THREADS", "argument"); `usable_cpus`, the CPUs this process may run on (None when
    unknown); `load`, the one-minute load average (None when unknown); and `warnings`, each one sentence."""

    threads: int
    source: str
    usable_cpus: int | None
    load: float | None
    warnings: tuple[str, ...]

    def detail(self) -> str:
        """`2 (model_threads, default); this process may use 2 CPUs; load average 0.4`, then the warnings."""
        cpus = "" if self.usable_cpus is None else f"; this process may use {_cpus(self.usable_cpus)}"
        load = "" if self.load is None else f"; load average {self.load:.1f}"
        said = f"{self.threads} (model_threads, {self.source}){cpus}{load}"
        return "; ".join((said, *(f"warning: {w}" for w in self.warnings)))

    def line(self) -> str:
        """`model threads: ` and the `detail`: the line doctor and the worker print."""
        return f"model threads: {self.detail()}"

    def as_dict(self) -> dict[str, object]:
        """The advice as JSON: every field."""
        return {"threads": self.threads, "source": self.source, "usable_cpus": self.usable_cpus, "load": self.load,
                "warnings": list(self.warnings)}


def thread_advice(settings: Settings, *, loadavg: Callable[[], tuple[float, ...]] = os.getloadavg) -> ThreadAdvice:
    """Report `settings.model_threads`, where it came from, the usable CPUs and the load (`loadavg()[0]`); warn
    when the threads exceed the usable CPUs, or when the load average is at least the usable CPUs (they are
    busy). Never raises for what the platform cannot tell."""
    from emelex_memory.settings import setting_sources

    cpus = _usable_cpus()
    try:
        load: float | None = loadavg()[0]
    except (AttributeError, OSError):
        load = None
    threads = settings.model_threads
    warnings = []
    if cpus is not None and threads > cpus:
        warnings.append(f"{threads} threads on {_cpus(cpus)} contend with each other; set model_threads to at most "
                        f"{cpus}")
    if cpus is not None and load is not None and load >= cpus:
        warnings.append(f"the load average ({load:.1f}) shows all {_cpus(cpus)} this process may use busy: "
                        "generation may be many times slower; run the worker when the machine is quieter")
    return ThreadAdvice(threads, str(setting_sources(settings)["model_threads"]), cpus, load, tuple(warnings))


def _usable_cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on macOS: all the CPUs
        return os.cpu_count()


def _cpus(n: int) -> str:
    return f"{n} CPU" if n == 1 else f"{n} CPUs"
