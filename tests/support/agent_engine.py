"""Helpers of ENGINE's agent tests: a snapshot and a leased, replayed Session in a real store."""

from __future__ import annotations

from emelex_memory.agent.journal import record_snapshot
from emelex_memory.agent.snapshot import SessionSnapshot, ToolAuthority

SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 64}}, "required": ["path"]}


def authority(name: str = "effect", **changes) -> ToolAuthority:
    """A tool authority with test values; `changes` override fields."""
    fields = dict(name=name, description=f"the {name} tool", input_schema=SCHEMA, approval="never",
                  plugin="test-tools", plugin_version="1.0")
    fields.update(changes)
    return ToolAuthority(**fields)


def snapshot(**changes) -> SessionSnapshot:
    """A snapshot with test values and the tools `effect` and `read_file`; `changes` override fields."""
    fields = dict(model_reference="test/model", model_snapshot_id="a" * 64, protocol="emelex-tools/1",
                  template_digest="b" * 64, context_size=2048, temperature=0.2, seed=7, round_tokens=256,
                  chain_limit=4, calls_per_batch=2, system_prompt="You are a test.",
                  tools=(authority("effect"), authority("read_file")))
    fields.update(changes)
    return SessionSnapshot(**fields)


def leased_session(store, workspace, snap: SessionSnapshot | None = None):
    """A new Session with `snap` (default `snapshot()`) recorded, and its replayed lease."""
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    list(lease.replay_all())
    record_snapshot(store, lease, snap or snapshot())
    return session, lease
