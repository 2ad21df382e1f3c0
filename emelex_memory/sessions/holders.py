"""Who holds a Session lease or a job claim: the live-lease predicate, the holder label recorded with a lease or
a claim, and the process identity in it.

Kept apart from `leases.py` so that the queue, which records the same labels, does not import the transcript.
"""

from __future__ import annotations

import os
import socket

import apsw


def process_identity() -> str:
    """What tells this process's pid apart from the same number elsewhere on a host of the same name: the kernel's
    boot ID (first 8 hex digits) and the pid namespace's inode, `1a2b3c4d.4026531836`; "" where the platform
    exposes neither (then only host and pid can be compared)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip().replace("-", "")[:8]
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except (OSError, ValueError):
        return ""
    return f"{boot}.{namespace}"


def holder_label() -> str:
    """`pid@host#identity` (`process_identity`; `pid@host` where it is ""), recorded with a lease or a claim so
    that `holder_is_dead` can tell whether the holder is a process it can see."""
    identity = process_identity()
    return f"{os.getpid()}@{socket.gethostname()}{'#' + identity if identity else ''}"[:200]


def holder_is_dead(holder: str | None) -> bool:
    """True when `holder` ("pid@host#identity", as `holder_label` records it) names this host, this boot
    and this pid namespace (`process_identity`), and no process has that pid: `os.kill(pid, 0)` raises
    `ProcessLookupError`. Anything else (another host, boot or container, a label without the identity this
    process has, a live or reused pid, a label it cannot parse) is False: never presumed dead."""
    if not holder or "@" not in holder:
        return False
    pid, place = holder.split("@", 1)
    host, _, identity = place.partition("#")
    if not pid.isdigit() or int(pid) <= 0 or host != socket.gethostname() or identity != process_identity():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # e.g. PermissionError: the process exists, as another user's
    return False


def live_lease(alias: str = "", now: str = "?") -> str:
    """The one SQL condition "this `session_leases` row (named `alias`, if given) is a live lease": active and not
    expired at the parameter `now` (a plain `?` by default) the caller binds to its now. Every query asking whether a
    Session is held uses it."""
    p = f"{alias}." if alias else ""
    return f"{p}state = 'active' AND {p}expires_at > {now}"


def live_holder(conn: apsw.Connection, rowid: int, now: float) -> tuple[str, float] | None:
    """The holder label and expiry of the live lease on the Session with row id `rowid` at `now`, or None."""
    return conn.execute(
        f"SELECT holder, expires_at FROM session_leases WHERE session_id = ? AND {live_lease()}", (rowid, now)
    ).fetchone()


def open_journal(session: str) -> str:
    """The one SQL condition "the Session whose row ID is the column `session` has an open agent journal" (an
    `agent_turns` row: a turn of a crashed or interrupted agent, closed by its resume or `sessions recover`). Workers,
    retention and deletion treat such a Session as in use, as they do one with a live lease."""
    return f"EXISTS (SELECT 1 FROM agent_turns t WHERE t.session_id = {session})"
