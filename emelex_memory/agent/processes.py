"""Processes a tool started that may outlive the process that ran the tool, recorded so that another process, later,
can tell whether they still run, and stop them.

A tool's child (`run_command`'s shell, or any process a tool records through
`ToolInvocation.track_process`) keeps running when the chat that started it is
killed or exits at a second Ctrl-C. The journal records it with the started
call (`journal.record_process`) as a `ProcessRecord`: its pid and process
group, its start time as the kernel counts it and the identity of the boot it
started in. Recovery (`sessions recover`, `chat --resume`) refuses to settle
the call's unknown effect while it runs (`status`), and `stop` ends it on
request.

On Linux the start time is field 22 of `/proc/<pid>/stat` (clock ticks since
boot) and the boot's identity `/proc/sys/kernel/random/boot_id`: a record from
another boot has ended; a process whose pid was reused has another start
time; a group runs while any process of it (the recorded leader, or a member
that started no earlier) runs, and the kernel never gives the group's number
to a new process while one of its members lives. Stopping signals each
member through a pidfd (`os.pidfd_open`), checked again against its start
time, so a pid reused meanwhile is never signalled. The one case this cannot
tell apart: every process of the group ended, the number then went to a new
process elsewhere, which made its own group and exited, leaving members; that
group is taken for the tool's (a number wrapped around exactly once).

Elsewhere (macOS has no /proc), the record holds the pid and group only: the
group counts as running while `killpg(pgid, 0)` finds it, which a reused
group number also satisfies, so the status says it is unverified and `stop`
refuses: the user checks with `ps -g PGID` and stops it by hand.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

PROC = "/proc"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
MAX_LABEL = 200  # characters of a record's label (a command)
STOP_GRACE_S = 5.0  # how long `stop` waits after SIGTERM before SIGKILL, and after SIGKILL before it gives up
POLL_S = 0.05


@dataclass(frozen=True)
class ProcessRecord:
    """A process a tool started: its `pid`, its process group `pgid`, its `start` time as the kernel counts it and
    the `boot` it started in (both None where the system does not tell, see the module docstring), and a `label`
    saying what it is (`run_command`: the command)."""

    pid: int
    pgid: int
    start: int | None
    boot: str | None
    label: str

    def to_json(self) -> dict[str, Any]:
        """The record as the journal stores it."""
        return {"pid": self.pid, "pgid": self.pgid, "start": self.start, "boot": self.boot, "label": self.label}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ProcessRecord:
        """The record `to_json` made."""
        return cls(int(value["pid"]), int(value["pgid"]), value.get("start"), value.get("boot"),
                   str(value.get("label", "")))

    def describe(self) -> str:
        """`process group 4321 (`sleep 75; touch marker`)`."""
        label = f" (`{self.label}`)" if self.label else ""
        return f"process group {self.pgid}{label}" if self.pgid == self.pid else f"process {self.pid}{label}"


@dataclass(frozen=True)
class ProcessStatus:
    """Whether a recorded process still runs: `running`, with `verified` False where the system cannot tell a reused
    group number from the tool's (see the module docstring), and `why`, one clause."""

    running: bool
    verified: bool
    why: str


def boot_id() -> str | None:
    """This boot's identity (Linux), or None where the system does not say."""
    try:
        with open(BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time) of `pid` from /proc, or None when there is no such process."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _procfs() -> bool:
    return os.path.isdir(f"{PROC}/self") and _stat(os.getpid()) is not None


def identify(pid: int, label: str = "") -> ProcessRecord:
    """The record of the running process `pid` (its group, start time and boot), labelled `label` (cut to
    `MAX_LABEL` characters). Raises `ProcessLookupError` when there is no such process."""
    label = label if len(label) <= MAX_LABEL else label[:MAX_LABEL - 3] + "..."
    if _procfs():
        found = _stat(pid)
        if found is None:
            raise ProcessLookupError(pid)
        return ProcessRecord(pid, found[1], found[2], boot_id(), label)
    return ProcessRecord(pid, os.getpgid(pid), None, None, label)


def _members(record: ProcessRecord) -> list[tuple[int, int]]:
    """(pid, start time) of every live process of the recorded group (Linux): none when the group's number now
    belongs to another process."""
    leader = _stat(record.pid)
    if leader is not None and leader[2] != record.start:
        return []  # the number was given to another process: no process of the tool's group is left
    found = []
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is not None and stat[0] != "Z" and stat[1] == record.pgid and stat[2] >= record.start:
            found.append((int(name), stat[2]))
    return found


def status(record: ProcessRecord) -> ProcessStatus:
    """Whether the recorded process (its group, when it leads one) still runs; see the module docstring."""
    if record.start is not None and record.boot is not None:
        if not _procfs() or boot_id() != record.boot:
            return ProcessStatus(False, True, "it was started before the machine last restarted")
        members = _members(record)
        if not members:
            return ProcessStatus(False, True, "it has ended")
        return ProcessStatus(True, True, f"{len(members)} process(es) of it still run")
    try:
        os.killpg(record.pgid, 0)
    except ProcessLookupError:
        return ProcessStatus(False, True, "it has ended")
    except PermissionError:
        pass
    return ProcessStatus(True, False, f"a process group {record.pgid} exists (this system cannot tell whether it is "
                                      f"the tool's: check with `ps -g {record.pgid}`)")


def stop(record: ProcessRecord, grace_s: float = STOP_GRACE_S) -> ProcessStatus:
    """End the recorded process's group: SIGTERM to each live member, SIGKILL to what is left after `grace_s`, then
    wait up to `grace_s` more; return its status afterwards. Where the record cannot be verified (see the module
    docstring) nothing is signalled and the status says so."""
    before = status(record)
    if not before.running or not before.verified:
        return before
    for signum in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in _members(record):
            _signal(pid, start, signum)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not _members(record):
                return ProcessStatus(False, True, "it was stopped")
            time.sleep(POLL_S)
    return status(record)


def _signal(pid: int, start: int, signum: int) -> None:
    """Send `signum` to `pid` through a pidfd, only while `pid` is still the process that started at `start`."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return
    try:
        found = _stat(pid)
        if found is not None and found[2] == start:  # the pidfd pins this process: its number cannot move now
            signal.pidfd_send_signal(fd, signum)
    except (ProcessLookupError, OSError):
        pass
    finally:
        os.close(fd)
