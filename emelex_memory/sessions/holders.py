"""Who holds a Session lease or a job claim: the live-lease predicate, the holder label recorded with a lease or
a claim, and the process identity in it.

Kept apart from `leases.py` so that the queue, which records the same labels, does not import the transcript.
"""

from __future__ import annotations

import os
import socket


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


def live_lease(alias: str = "") -> str:
    """The one SQL condition "this `session_leases` row (named `alias`, if given) is a live lease": active and not
    expired at the `?` it leaves to bind (the caller's now). Every query asking whether a Session is held uses it."""
    p = f"{alias}." if alias else ""
    return f"{p}state = 'active' AND {p}expires_at > ?"


def open_journal(session: str) -> str:
    """The one SQL condition "the Session whose row ID is the column `session` has an open agent journal" (an
    `agent_turns` row: a turn of a crashed or interrupted agent, closed by its resume or `sessions recover`). Workers,
    retention and deletion treat such a Session as in use, as they do one with a live lease."""
    return f"EXISTS (SELECT 1 FROM agent_turns t WHERE t.session_id = {session})"
