"""Known-answer tests for every digest Emelex publishes or stores: fixed inputs built through the real code paths
into a real database, fixed expected hex, and an independent re-computation from the documented encoding.

If one of these literals changes, a digest algorithm changed: every recorded job source, Summary, Knowledge
provenance and snapshot reference written before no longer verifies. Do not update a literal to make a test
pass; version the domain instead.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import uuid
from pathlib import Path

import pytest

from emelex_memory import COMPACTION_KIND, MemoryStore, NewEvent, Settings, SummaryDraft
from emelex_memory.queue.kinds import JobKindRegistry
from emelex_memory.sessions import prefix_digest
from emelex_memory.knowledge import source_digest as knowledge_digest
from emelex_memory.snapshots import installed as model_snapshots
from emelex_memory.sessions.leases import token_digest
from emelex_memory.snapshots.installed import LinkedTarget, ModelFile, content_digest, manifest_bytes, read_installed
from emelex_memory.sessions.prefix_digest import digest_prefix, summary_digest

from ..support import Clock

U64 = struct.Struct(">Q").pack
DOMAINS = {
    "compaction source": b"emelex/compaction-source/v1\x00",
    "summary": b"emelex/summary/v1\x00",
    "knowledge source": b"emelex/knowledge-source/v1\n",
    "model content": b"emelex-model-content-v1\x00",
}
ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2 test vector

SOURCE_NO_BASE = "67974d857e6afafdf437fe7a60bb4eb99fd812f63569aa291ad4d465feab1b67"
SUMMARY = "1176a6d45ec9237e4df252ad87ed7649aea11e86f44a49b45e77828883af18f3"
SOURCE_WITH_BASE = "6ea47b10b0b6a20a4021a41d9d6ba55252f41118dde45f3582f47c9568ddce87"
KNOWLEDGE_SOURCE = "5fcb113ba54615c438322aeed19cbb1b808e4eacb3d38bb421314870faa97b1a"
LEASE_TOKEN = "7e223fc9eebacb6469420193fc9c1275b67d4db9408530dae7660cb3708f401b"
MODEL_CONTENT = "542e5e5e65d91f2e323443342550b05cc1b7dffdd6a1011a861d2af85111dea5"
JOB_SOURCE_KEY = "85e7709535b37497eda2810cdd438bc2a010298d14e513e05d6835cdecabf355"
SNAPSHOT_ID = "sha256:cfdbbf0ca51c6d7176ec4b084b22554a3dc80163983de08fce3dd87bc6ac0526"  # a format-1 manifest
SNAPSHOT_ID_V2 = "sha256:ec60a7af0985efb53f856cb2bc50fadd97f59bef3ad76972881235998e1377d1"  # format 2: no when/where


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Session and job UUIDs 00000000-0000-4000-8000-000000000001, ...2, ... in creation order."""
    counter = itertools.count(1)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(f"00000000-0000-4000-8000-{next(counter):012d}"))


def _frame(event_id: int, seq: int, turn: int, position: int, kind: str, payload: str, assets: str) -> bytes:
    """One event's frame, written from the encoding documented in sessions/prefix_digest.py."""
    k, p, a = kind.encode(), payload.encode(), assets.encode()
    return U64(event_id) + U64(seq) + U64(turn) + U64(position) + U64(len(k)) + k + U64(len(p)) + p + U64(len(a)) + a


def _turns(store: MemoryStore, session_id: str, workspace: Path, texts: list[str], assets=()) -> None:
    with store.acquire_lease(session_id, workspace) as lease:
        list(lease.replay_all())
        for i, text in enumerate(texts):
            lease.append_turn([NewEvent("user", {"text": text}, assets=assets if i == 0 else ()),
                               NewEvent("assistant", {"text": text.upper()})])
        lease.release()


@pytest.fixture
def compacted(fixed_ids: None, db_path: Path, tmp_path: Path, workspace: Path):
    """A fresh database: a Session (ID ...1) of 6 turns, the first with the asset b"abc", compacted once by job ...2
    (Summary "the summary"), then 6 more turns and a second compaction job (...3) planned on top of the Summary."""
    store = MemoryStore.open_path(db_path, Settings(home=tmp_path / "home"), clock=Clock())
    ref = store.put_asset(b"abc", "image/png")
    session = store.create_session(workspace)
    _turns(store, session.id, workspace, [f"turn {i}" for i in range(6)], assets=(ref,))
    first = store.queue_compaction(session.id, context_window=1000, count_tokens=lambda e: 10, force=True)
    with store.claim_job(kinds=COMPACTION_KIND) as claim:
        claim.complete(SummaryDraft("the summary", model_ref="m@sha256:" + "0" * 64))
    _turns(store, session.id, workspace, [f"later {i}" for i in range(6)])
    second = store.queue_compaction(session.id, context_window=1000, count_tokens=lambda e: 10, force=True)
    yield store, session.id, ref, first.job, second.job
    store.close()


def test_asset_digests_are_plain_sha256_of_the_bytes(compacted) -> None:
    _, _, ref, _, _ = compacted
    assert ref.digest == ABC_SHA256


def test_compaction_source_digest_without_a_base_summary(compacted) -> None:
    store, sid, ref, job, _ = compacted
    assert job.id == "00000000-0000-4000-8000-000000000002" and job.source["base_summary_id"] is None
    assert job.source["digest"] == SOURCE_NO_BASE
    with store.db.read() as conn:
        rows = conn.execute(
            "SELECT id, seq, turn, position, kind, payload, coalesce(asset_refs, '') FROM events "
            "WHERE session_id = 1 AND seq <= ? ORDER BY seq", (job.source["through_seq"],)
        ).fetchall()
        assert digest_prefix(conn, 1, None, 0, job.source["through_seq"]).digest == SOURCE_NO_BASE
    assert rows[0][6] == json.dumps([[ABC_SHA256, 3, "image/png"]], separators=(",", ":"))  # the asset framing
    independent = hashlib.sha256(DOMAINS["compaction source"] + b"".join(_frame(*r) for r in rows) + U64(len(rows)))
    assert independent.hexdigest() == SOURCE_NO_BASE


def test_summary_digest(compacted) -> None:
    store, _, _, job, _ = compacted
    with store.db.read() as conn:
        payload, stored = conn.execute(
            "SELECT e.payload, s.summary_digest FROM summaries s JOIN events e ON e.id = s.event_id"
        ).fetchone()
    document = json.loads(payload)
    assert document["text"] == "the summary" and document["provenance"]["job"] == job.id
    data = payload.encode()
    assert stored.hex() == summary_digest(data).hex() == SUMMARY
    assert hashlib.sha256(DOMAINS["summary"] + U64(len(data)) + data).hexdigest() == SUMMARY


def test_compaction_source_digest_with_a_base_summary(compacted) -> None:
    store, _, _, first, second = compacted
    base, through = second.source["base_summary_id"], second.source["through_seq"]
    assert base is not None and second.source["digest"] == SOURCE_WITH_BASE
    with store.db.read() as conn:
        base_through = conn.execute("SELECT through_seq FROM summaries WHERE event_id = ?", (base,)).fetchone()[0]
        columns = "id, seq, turn, position, kind, payload, coalesce(asset_refs, '')"
        rows = conn.execute(f"SELECT {columns} FROM events WHERE id = ?", (base,)).fetchall() + conn.execute(
            f"SELECT {columns} FROM events WHERE session_id = 1 AND seq > ? AND seq <= ? AND kind != 'summary' "
            "ORDER BY seq", (base_through, through)).fetchall()
    independent = hashlib.sha256(DOMAINS["compaction source"] + b"".join(_frame(*r) for r in rows) + U64(len(rows)))
    assert rows[0][4] == "summary" and independent.hexdigest() == SOURCE_WITH_BASE


def test_knowledge_source_digest(compacted) -> None:
    store, sid, _, _, _ = compacted
    assert sid == "00000000-0000-4000-8000-000000000001"
    source = store.knowledge_source(sid, 1, 4)
    assert source.digest == KNOWLEDGE_SOURCE
    body = sid.encode() + b"\n"
    with store.db.read() as conn:
        rows = conn.execute("SELECT seq, kind, size, payload FROM events WHERE session_id = 1 AND seq BETWEEN 1 AND 4 "
                            "ORDER BY seq").fetchall()
    for seq, kind, size, payload in rows:
        body += f"{seq} {kind} {size}\n".encode() + payload.encode()
    assert hashlib.sha256(DOMAINS["knowledge source"] + body).hexdigest() == KNOWLEDGE_SOURCE


def test_lease_token_digest(fixed_ids: None, store: MemoryStore, workspace: Path, monkeypatch) -> None:
    monkeypatch.setattr("emelex_memory.sessions.service.new_token", lambda: "emelex-known-answer-lease-token")
    session = store.create_session(workspace)
    lease = store.acquire_lease(session.id, workspace)
    with store.db.read() as conn:
        stored = conn.execute("SELECT token_hash FROM session_leases").fetchone()[0]
    assert lease.token == "emelex-known-answer-lease-token"
    assert stored.hex() == token_digest(lease.token).hex() == LEASE_TOKEN
    assert hashlib.sha256(b"emelex-known-answer-lease-token").hexdigest() == LEASE_TOKEN


def test_default_job_source_key(store: MemoryStore, kinds: JobKindRegistry, workspace: Path) -> None:
    kinds.register("noop")  # as the queue tests register it
    session = store.create_session(workspace)
    job = store.enqueue_job("noop", session.id, {"b": 2, "a": [1, "x"], "t": "\u00e9"}).job
    assert job.source_key == JOB_SOURCE_KEY
    assert hashlib.sha256('{"a":[1,"x"],"b":2,"t":"\u00e9"}'.encode()).hexdigest() == JOB_SOURCE_KEY


def canonical(value: dict) -> bytes:
    """Canonical JSON as docs/models.md defines it: sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_model_content_digest_and_snapshot_id(tmp_path: Path) -> None:
    home = tmp_path / "home"
    directory = home / "models" / "known-answer"
    directory.mkdir(parents=True, mode=0o700)
    (home / "models").chmod(0o700)
    home.chmod(0o700)
    files = (ModelFile("model.gguf", 8, hashlib.sha256(b"GGUF\x03\x00\x00\x00").hexdigest()),)
    manifest = manifest_bytes("known-answer", "owned", files, 1_700_000_000.5, "known-answer-test", None)
    legacy = canonical({**json.loads(manifest), "format": 1})  # as every manifest before format 2 was written
    model_snapshots.write_private_file(directory / model_snapshots.MANIFEST_NAME, legacy)
    installed = read_installed(home, "known-answer")
    assert content_digest(files) == MODEL_CONTENT
    assert installed.reference == f"known-answer@sha256:{MODEL_CONTENT}"
    assert installed.snapshot_id == SNAPSHOT_ID == "sha256:" + hashlib.sha256(legacy).hexdigest()
    (directory / model_snapshots.MANIFEST_NAME).unlink()
    model_snapshots.write_private_file(directory / model_snapshots.MANIFEST_NAME, manifest)
    identity = {k: v for k, v in json.loads(manifest).items() if k not in ("installed_at", "origin")}
    assert read_installed(home, "known-answer").snapshot_id == SNAPSHOT_ID_V2 == \
        "sha256:" + hashlib.sha256(canonical(identity)).hexdigest()
    inventory = json.dumps([{"sha256": files[0].sha256, "size": 8}], separators=(",", ":"), sort_keys=True)
    assert hashlib.sha256(DOMAINS["model content"] + inventory.encode()).hexdigest() == MODEL_CONTENT
    linked = manifest_bytes("known-answer", "linked", files, 1_700_000_000.5, "known-answer-test",
                            LinkedTarget("/models/x.gguf", 1, 2, 8, 3))
    assert hashlib.sha256(linked).hexdigest() != hashlib.sha256(manifest).hexdigest()


def test_the_domains_are_the_code_s_and_keep_digests_apart() -> None:
    assert DOMAINS == {
        "compaction source": prefix_digest.SOURCE_DOMAIN,
        "summary": prefix_digest.SUMMARY_DOMAIN,
        "knowledge source": knowledge_digest.SOURCE_DIGEST_DOMAIN,
        "model content": model_snapshots._CONTENT_DOMAIN,
    }
    for a, b in itertools.permutations(DOMAINS.values(), 2):
        assert not a.startswith(b)  # no domain is a prefix of another, so no body can make one read as the other
    body = b"the same bytes"
    digests = {hashlib.sha256(domain + body).hexdigest() for domain in DOMAINS.values()}
    assert len(digests) == len(DOMAINS) and hashlib.sha256(body).hexdigest() not in digests
    data = b'{"text":"x"}'
    assert summary_digest(data) != hashlib.sha256(DOMAINS["compaction source"] + U64(len(data)) + data).digest()
