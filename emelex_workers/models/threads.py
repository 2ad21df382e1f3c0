"""How many CPU threads the model uses: chosen when the work starts from the machine as it is, unless set.

llama.cpp's threads wait on each other at every step, so a thread whose core
another process holds slows them all: on a 2-core machine under other load, 2
threads were 3.6-4.7x slower than 1, while on the same machine quiet 2 were
2.1x faster. So no fixed number is right, and unless `model_threads` is set
(config.toml, `EMELEX_MODEL_THREADS` or an argument) the number is chosen
(`choose_threads`) from:

- the CPUs this process may use: its affinity (`os.sched_getaffinity`), capped
  by a cgroup CPU quota (`cpu.max`, or v1's `cpu.cfs_quota_us`), rounded down;
- never more than the physical cores among them (`/proc/cpuinfo`): a second
  hyper-thread of a core adds little and contends;
- fewer when other work keeps them busy: the CPU time of those CPUs that was
  not idle over a short probe (`PROBE_S`, from `/proc/stat`), or, where that
  cannot be read, the one-minute load average. Each thread needs at least
  `IDLE_PER_THREAD` of an idle CPU (and one thread always runs).

`thread_choice` reads those inputs and says what was chosen and why, in one
line for the worker's start and `doctor`; `model_threads` set explicitly is
used as given, with a warning when it exceeds the usable CPUs or they are busy.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..settings import WorkerSettings

PROBE_S = 0.2  # how long the busy probe samples /proc/stat
IDLE_PER_THREAD = 0.75  # the idle share of a CPU each thread beyond the first needs


@dataclass(frozen=True)
class MachineLoad:
    """The inputs of the choice: `usable_cpus` (affinity; None when unknown), `quota` (the cgroup CPU quota in
    CPUs; None when there is none), `physical_cores` (among the usable CPUs; None when unknown), `busy` (CPUs'
    worth of non-idle time over the probe, among the usable CPUs; None when not measured) and `load` (the one-minute
    load average; None when unknown)."""

    usable_cpus: int | None
    quota: float | None
    physical_cores: int | None
    busy: float | None
    load: float | None


@dataclass(frozen=True)
class ThreadChoice:
    """`threads`, the number the model uses; `source`: "chosen" or where the `model_threads` setting came from
    ("default" never: then it is chosen); `chosen`, what the policy picks on this machine (the same as `threads`
    when chosen); `machine`, its inputs; `reason`, one clause; `warnings`, each one sentence."""

    threads: int
    source: str
    chosen: int
    machine: MachineLoad
    reason: str
    warnings: tuple[str, ...]

    def detail(self) -> str:
        """`1 (chosen: 1.6 of 2 CPUs busy ...); this process may use 2 CPUs, 2 physical cores, no CPU quota; ...`,
        then any warning: what the worker and doctor print after `model threads: `."""
        how = f"chosen: {self.reason}" if self.source == "chosen" else (
            f"model_threads, {self.source}; the choice here would be {self.chosen}")
        return "; ".join((f"{self.threads} ({how})", _facts(self.machine), *(f"warning: {w}" for w in self.warnings)))

    def line(self) -> str:
        """`model threads: ` and the `detail`."""
        return f"model threads: {self.detail()}"

    def as_dict(self) -> dict[str, object]:
        """The choice as JSON: every field, the machine's inputs flattened in."""
        m = self.machine
        return {"threads": self.threads, "source": self.source, "chosen": self.chosen, "reason": self.reason,
                "usable_cpus": m.usable_cpus, "quota": m.quota, "physical_cores": m.physical_cores, "busy": m.busy,
                "load": m.load, "warnings": list(self.warnings)}


def choose_threads(machine: MachineLoad) -> tuple[int, str]:
    """The thread count for `machine` and why, as one clause. Pure.

    The ceiling is the usable CPUs, rounded down to the CPU quota (at least 1) and capped at the physical cores;
    unknown inputs impose nothing (no affinity known: 1). Then, of that ceiling, the CPUs other work leaves idle:
    `busy` where measured, else `load`: as many threads as there are idle CPUs, one counted from
    `IDLE_PER_THREAD` of an idle CPU on (at least 1).
    """
    ceiling = machine.usable_cpus or 1
    limits = [f"{_cpus(ceiling)} usable"]
    if machine.quota is not None and max(1, math.floor(machine.quota)) < ceiling:
        ceiling = max(1, math.floor(machine.quota))
        limits.append(f"a CPU quota of {machine.quota:g}")
    if machine.physical_cores is not None and machine.physical_cores < ceiling:
        ceiling = machine.physical_cores
        limits.append(f"{machine.physical_cores} physical cores")
    busy, what = (machine.busy, "measured") if machine.busy is not None else (machine.load, "load average")
    if busy is None:
        return ceiling, f"{' and '.join(limits)}; how busy they are is unknown"
    idle = (machine.usable_cpus or ceiling) - busy
    threads = max(1, min(ceiling, math.floor(idle + 1 - IDLE_PER_THREAD + 1e-9)))
    if threads < ceiling:
        return threads, (f"{' and '.join(limits)}, but other work keeps {busy:.1f} of them busy ({what}): more "
                         "threads would wait on each other")
    return threads, f"{' and '.join(limits)}, {busy:.1f} of them busy ({what})"


def thread_choice(settings: WorkerSettings, *, machine: Callable[[], MachineLoad] | None = None) -> ThreadChoice:
    """The threads a model bound with `settings` uses: `settings.model_threads` when it is set (with where it came
    from, and warnings when it exceeds the usable CPUs or they are busy), otherwise `choose_threads` of the machine:
    `machine()`, by default `process_machine()` (the machine as this process first read it, so the worker's start
    line and its binding agree). Never raises for what the platform cannot tell."""
    from emelex_memory.core.settings import setting_sources

    found = (machine or process_machine)()
    chosen, reason = choose_threads(found)
    if settings.model_threads is None:
        return ThreadChoice(chosen, "chosen", chosen, found, reason, ())
    threads, cpus = settings.model_threads, found.usable_cpus
    warnings = []
    if cpus is not None and threads > cpus:
        warnings.append(f"{threads} threads on {_cpus(cpus)} contend with each other; set model_threads to at most "
                        f"{cpus}, or unset it to have it chosen")
    if threads > chosen:
        warnings.append(f"other work keeps this machine busy ({reason}): {threads} threads may be many times slower "
                        f"than {chosen}; unset model_threads to have it chosen")
    return ThreadChoice(threads, str(setting_sources(settings)["model_threads"]), chosen, found, reason,
                        tuple(warnings))


def model_threads(settings: WorkerSettings) -> int:
    """The thread count for a binding: `settings.model_threads`, or the choice on this machine now."""
    return settings.model_threads or thread_choice(settings).threads


@functools.cache
def process_machine() -> MachineLoad:
    """`read_machine()` as first called in this process: the work starts once, and its choice holds for it."""
    return read_machine()


def read_machine(*, probe_s: float = PROBE_S, loadavg: Callable[[], tuple[float, ...]] = os.getloadavg,
                 sleep: Callable[[float], None] = time.sleep) -> MachineLoad:
    """This machine's `MachineLoad` now: affinity, cgroup quota, physical cores, the busy probe over `probe_s`
    seconds (`/proc/stat`; skipped when `probe_s` is 0) and the load average. Never raises."""
    cpus = _affinity()
    before = _cpu_times(cpus) if probe_s > 0 else None
    if before is not None:
        sleep(probe_s)
    after = _cpu_times(cpus) if before is not None else None
    busy = None
    if before is not None and after is not None:
        (busy0, total0), (busy1, total1) = before, after
        if total1 > total0:
            busy = round(len(cpus or ()) * (busy1 - busy0) / (total1 - total0), 2)
    try:
        load: float | None = loadavg()[0]
    except (AttributeError, OSError):
        load = None
    return MachineLoad(len(cpus) if cpus else os.cpu_count(), _cgroup_quota(), _physical_cores(cpus), busy, load)


def _affinity() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on macOS
        return None


def _cpu_times(cpus: set[int] | None) -> tuple[int, int] | None:
    """(non-idle, total) jiffies summed over `cpus` from /proc/stat; None when unreadable."""
    if not cpus:
        return None
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(values)
            busy += sum(values) - values[3] - values[4]
    return (busy, total) if total else None


def _cgroup_quota() -> float | None:
    """The cgroup CPU quota in CPUs (v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`); None when
    there is none or it cannot be read."""
    try:
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in groups:
        _, controllers, path = line.split(":", 2)
        try:
            if controllers == "":
                quota, period = Path(f"/sys/fs/cgroup{path}/cpu.max").read_text().split()[:2]
            elif "cpu" in controllers.split(","):
                base = Path(f"/sys/fs/cgroup/{controllers}{path}")
                quota, period = ((base / n).read_text().strip() for n in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
            else:
                continue
        except (OSError, ValueError):
            continue
        if quota not in ("max", "-1") and int(period) > 0:
            return int(quota) / int(period)
    return None


def _physical_cores(cpus: set[int] | None) -> int | None:
    """Distinct (physical id, core id) pairs among `cpus` in /proc/cpuinfo; None when it does not say."""
    try:
        blocks = Path("/proc/cpuinfo").read_text().split("\n\n")
    except OSError:
        return None
    cores = set()
    for block in blocks:
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "processor" not in fields or "core id" not in fields:
            continue
        if cpus is None or int(fields["processor"]) in cpus:
            cores.add((fields.get("physical id"), fields["core id"]))
    return len(cores) or None


def _facts(m: MachineLoad) -> str:
    cpus = "unknown usable CPUs" if m.usable_cpus is None else f"this process may use {_cpus(m.usable_cpus)}"
    cores = "" if m.physical_cores is None else f", {m.physical_cores} physical cores"
    quota = ", no CPU quota" if m.quota is None else f", a CPU quota of {m.quota:g}"
    busy = "" if m.busy is None else f"; {m.busy:.1f} busy over {PROBE_S:g} s"
    load = "" if m.load is None else f"; load average {m.load:.1f}"
    return f"{cpus}{cores}{quota}{busy}{load}"


def _cpus(n: int) -> str:
    return f"{n} CPU" if n == 1 else f"{n} CPUs"
