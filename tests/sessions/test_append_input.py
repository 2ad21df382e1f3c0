"""append_turn input validation: every bad input is a typed error and leaves the database unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from emelex_memory import (
    InvalidEventError,
    JsonNonFiniteError,
    JsonTooDeepError,
    JsonTooLargeError,
    JsonUnencodableError,
    MemoryStore,
    NewEvent,
    ReservedEventKindError,
    Settings,
)
from emelex_memory.core import jsonbound
from emelex_memory.core.jsonbound import encode_canonical, encode_canonical_text, encode_streaming

from ..support import table_rows


@pytest.fixture
def small(tmp_path: Path, db_path: Path):
    settings = Settings(home=tmp_path / "h", max_event_bytes=1000, max_turn_bytes=2500, max_json_depth=5,
                        max_events_per_turn=4)
    return MemoryStore.open_path(db_path, settings)


@pytest.fixture
def lease(small: MemoryStore, workspace: Path):
    session = small.create_session(workspace)
    lease = small.acquire_lease(session.id, workspace)
    lease.replay()
    lease.append_turn([NewEvent("user", "first")])
    return lease


def _nest(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_TURNS = [
    ([NewEvent("user", "x" * 1000)], JsonTooLargeError, "event 0"),
    ([NewEvent("user", "x" * 900)] * 3, JsonTooLargeError, "the turn is larger"),
    ([NewEvent("user", "ok"), NewEvent("user", _nest(6))], JsonTooDeepError, "deeper than 5"),
    ([NewEvent("user", {"a": math.nan})], JsonNonFiniteError, "NaN"),
    ([NewEvent("user", [math.inf])], JsonNonFiniteError, "inf"),
    ([NewEvent("user", "ok"), NewEvent("user", {"t": "bad \ud800 surrogate"})], JsonUnencodableError, "UTF-8"),
    ([NewEvent("user", {"\udfff": 1})], JsonUnencodableError, "UTF-8"),
    ([NewEvent("user", {1: "int key"})], JsonUnencodableError, "non-string object key"),
    ([NewEvent("user", {"b": b"bytes"})], JsonUnencodableError, "bytes"),
    ([NewEvent("user", {1.5})], JsonUnencodableError, "set"),
    ([NewEvent("user", 10**5000)], JsonTooLargeError, "integer too large"),
    ([NewEvent("user", {"big": "x" * 50_000_000})], JsonTooLargeError, "event 0"),
    ([NewEvent("summary", "forged")], ReservedEventKindError, "reserved"),
    ([NewEvent("User", "x")], InvalidEventError, "lowercase"),
    ([NewEvent("", "x")], InvalidEventError, "kind"),
    ([], InvalidEventError, "at least one"),
    ([NewEvent("user", 1)] * 5, InvalidEventError, "at most 4"),
    ([{"kind": "user", "payload": 1}], InvalidEventError, "expected NewEvent"),
]


@pytest.mark.parametrize(("events", "error", "words"), BAD_TURNS)
def test_bad_turn_is_refused_and_nothing_changes(small: MemoryStore, lease, events, error, words) -> None:
    before = table_rows(small.path)
    with pytest.raises(error, match=words):
        lease.append_turn(events)
    assert table_rows(small.path) == before
    assert lease.append_turn([NewEvent("user", "still works")]).turn == 2


def test_limits_at_the_cap_are_accepted(small: MemoryStore, lease) -> None:
    exactly = "x" * 998  # plus two quotes = 1000 bytes
    assert len(encode_canonical(exactly, max_bytes=1000, max_depth=5)) == 1000
    lease.append_turn([NewEvent("user", exactly), NewEvent("user", _nest(5))])


def test_canonical_encoding_sorts_keys_and_keeps_unicode() -> None:
    value = {"b": [1, 2.5, True, None], "a": "é\n\"", "c": {"z": -0.0, "y": 10**30}}
    data = encode_canonical(value, max_bytes=10_000, max_depth=10)
    assert data == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@hsettings(max_examples=200, deadline=None)
@given(json_values)
def test_canonical_encoding_round_trips(value) -> None:
    try:
        data = encode_canonical(value, max_bytes=1_000_000, max_depth=50)
    except JsonUnencodableError:
        with pytest.raises(UnicodeEncodeError):
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        return
    assert json.loads(data) == value
    assert data == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@hsettings(max_examples=200, deadline=None)
@given(json_values)
def test_byte_cap_is_exact(value) -> None:
    try:
        exact = len(encode_canonical(value, max_bytes=1_000_000, max_depth=50))
    except JsonUnencodableError:
        return
    assert len(encode_canonical(value, max_bytes=exact, max_depth=50)) == exact
    with pytest.raises(JsonTooLargeError):
        encode_canonical(value, max_bytes=exact - 1, max_depth=50)


wide_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(max_size=3)
    | st.tuples(st.integers()) | st.dictionaries(st.integers(), st.none(), min_size=1, max_size=2),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@hsettings(max_examples=300, deadline=None)
@given(wide_values, st.integers(min_value=2, max_value=400), st.integers(min_value=0, max_value=6))
def test_the_one_call_encoder_and_the_streaming_encoder_agree(value, cap, depth) -> None:
    def outcome(encode):
        try:
            return encode(value, max_bytes=cap, max_depth=depth, what="v")
        except Exception as exc:  # the typed error and its message must match too
            return type(exc), str(exc)

    assert jsonbound._C_ENCODE is not None  # this Python has the C encoder, so both paths really ran
    assert outcome(encode_canonical_text) == outcome(encode_streaming)


def test_shared_structure_that_would_expand_past_the_cap_is_refused() -> None:
    value: object = "x" * 100
    for _ in range(40):  # 2**40 copies of the string if fully expanded
        value = [value, value]
    with pytest.raises(JsonTooLargeError):
        encode_canonical(value, max_bytes=1_000_000, max_depth=50)
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(JsonTooDeepError):
        encode_canonical(cycle, max_bytes=1_000_000, max_depth=50)


def test_the_deepest_allowed_nesting_encodes_and_deeper_settings_are_refused(tmp_path: Path) -> None:
    value = _nest(200)
    assert encode_canonical(value, max_bytes=10_000, max_depth=200) == ("[" * 200 + "1" + "]" * 200).encode()
    assert encode_streaming(value, max_bytes=10_000, max_depth=200)[1] == 401
    with pytest.raises(JsonTooDeepError):
        encode_canonical(_nest(201), max_bytes=10_000, max_depth=200)
    with pytest.raises(ValueError, match="max_json_depth"):
        Settings(home=tmp_path / "h", max_json_depth=201)
