"""Processes a tool started that may outlive the process running it: how they are identified (process group, start
time, boot), when they count as running (a pid reused, another boot, a group whose leader left members behind), how
they are stopped (SIGTERM, then SIGKILL for what ignores it), how the journal records them, and how recovery refuses
to settle a call while one runs, stops it on request and says once it has ended. Real child processes throughout."""

from __future__ import annotations

import dataclasses
import subprocess
import time

import pytest

from emelex_memory import MemoryStore, ToolStillRunningError, UnknownEffectsError
from emelex_memory.agent import journal as j
from emelex_memory.agent.processes import ProcessRecord, ProcessStatus, boot_id, identify, status, stop
from emelex_memory.agent.recovery import recover_session
from emelex_memory.errors import JournalStateError

from ..support import table_rows
from ..support.agent_engine import leased_session

DEADLINE_S = 30.0


def _spawn(script: str) -> subprocess.Popen:
    """`sh -c script` in a process group of its own, as run_command starts a command."""
    return subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True, stdin=subprocess.DEVNULL)


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def child():
    proc = _spawn("exec sleep 60")  # one process, the group's leader
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_a_running_child_is_identified_by_group_start_and_boot_and_ends_when_it_exits(child) -> None:
    record = identify(child.pid, "sleep 60")
    assert (record.pid, record.pgid, record.boot, record.label) == (child.pid, child.pid, boot_id(), "sleep 60")
    assert isinstance(record.start, int) and record.start > 0
    assert status(record) == status(ProcessRecord.from_json(record.to_json()))
    assert status(record).running and status(record).verified
    child.kill()
    child.wait()
    assert not status(record).running and status(record).why == "it has ended"


def test_a_record_from_another_boot_or_of_a_reused_pid_has_ended(child) -> None:
    record = identify(child.pid)
    other_boot = dataclasses.replace(record, boot="00000000-0000-0000-0000-000000000000")
    assert not status(other_boot).running
    assert status(other_boot).why == "it was started before the machine last restarted"
    reused = dataclasses.replace(record, start=record.start - 1)  # the same number, another process
    assert not status(reused).running and status(reused).why == "it has ended"
    assert status(record).running


def test_a_group_whose_leader_left_runs_while_a_member_does_and_stop_ends_even_one_ignoring_sigterm(tmp_path) -> None:
    ready = tmp_path / "ready"
    leader = _spawn(f"(trap '' TERM; touch {ready}; sleep 60) & exit 0")  # the shell leaves a member behind
    record = identify(leader.pid, "the shell")
    leader.wait()
    _until(ready.exists, "the member never started")
    assert status(record).running and status(record).why == "1 process(es) of it still run"
    stopped = stop(record, grace_s=0.5)  # SIGTERM is ignored: SIGKILL after the grace
    assert not stopped.running and stopped.why == "it was stopped"
    assert not status(record).running


def test_the_journal_records_the_processes_of_a_started_call_only(store: MemoryStore, workspace, db_path,
                                                                  child) -> None:
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "run it")
    j.plan_batch(store, lease, 1, "{}", [("c1", "run_command", {"command": "sleep 60"})])
    record = identify(child.pid, "sleep 60")
    before = table_rows(db_path)
    with pytest.raises(JournalStateError, match="only a started call records"):
        j.record_process(store, lease, "c1", record)
    assert table_rows(db_path) == before
    j.start_call(store, lease, "c1")
    j.record_process(store, lease, "c1", record)
    recorded = table_rows(db_path)
    j.record_process(store, lease, "c1", record)  # the same process again changes nothing
    assert table_rows(db_path) == recorded
    (call,) = j.read_journal(store, session.id).calls
    assert call.processes == (record,) and [r for r, _ in call.running()] == [record]
    assert j.read_journal(store, session.id).to_json()["calls"][0]["processes"] == [record.to_json()]


def test_recovery_refuses_a_call_whose_process_runs_stops_it_on_request_and_says_when_it_ended(
    store: MemoryStore, workspace, db_path, child
) -> None:
    session, lease = leased_session(store, workspace)
    j.open_turn(store, lease, "run it")
    j.plan_batch(store, lease, 1, "{}", [("c1", "run_command", {"command": "sleep 60"})])
    j.start_call(store, lease, "c1")
    record = identify(child.pid, "sleep 60")
    j.record_process(store, lease, "c1", record)
    lease.release()  # the chat that ran it is gone; its command is not
    before = table_rows(db_path)
    with pytest.raises(ToolStillRunningError) as running:
        recover_session(store, session.id, accept_unknown_effects=True)
    assert str(running.value).startswith(f"Session {session.id} has a tool call still running: process group "
                                         f"{child.pid} (`sleep 60`): 1 process(es) of it still run; ")
    assert f"`emelex memory sessions recover {session.id} --stop-running`" in str(running.value)
    assert running.value.running == ((running.value.calls[0], record),)
    assert table_rows(db_path) == before  # refused: nothing written
    with pytest.raises(UnknownEffectsError) as unknown:  # stopped, but its effect stays unknown until accepted
        recover_session(store, session.id, stop_running=True)
    assert not isinstance(unknown.value, ToolStillRunningError)
    assert unknown.value.stopped == ((record, ProcessStatus(False, True, "it was stopped")),)
    assert f"its process group {child.pid} (`sleep 60`): it has ended" in str(unknown.value)
    child.wait()
    assert table_rows(db_path) == before
    done = recover_session(store, session.id, accept_unknown_effects=True)
    assert [r["outcome"] for r in done.reconciled.results] == ["unknown_effect"]
