
-- The immutable execution snapshot of an agent Session, outside the (compactable) transcript: written once, in the
-- transaction that proves the Session empty, and never changed.
CREATE TABLE session_snapshots (
    session_id INTEGER PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    digest TEXT NOT NULL CHECK (length(digest) = 64),   -- SHA-256 of `snapshot`
    snapshot TEXT NOT NULL,                              -- canonical JSON of the SessionSnapshot
    created_at REAL NOT NULL
) STRICT;
CREATE TRIGGER session_snapshots_immutable BEFORE UPDATE ON session_snapshots
BEGIN SELECT RAISE(ABORT, 'execution snapshots are immutable'); END;

-- The open agent turn of a Session (at most one): its input is in the transcript; the turn is closed (the row deleted)
-- by the answer, by a failure record, or by reconciliation. `round` is the round of the batch journaled in agent_calls
-- (NULL when none is), `raw` that round's model output.
CREATE TABLE agent_turns (
    session_id INTEGER PRIMARY KEY REFERENCES sessions (id) ON DELETE CASCADE,
    input_seq INTEGER NOT NULL CHECK (input_seq >= 1),   -- seq of the turn's user event
    published INTEGER NOT NULL DEFAULT 0 CHECK (published >= 0),  -- call/result batches already in the transcript
    round INTEGER CHECK (round IS NULL OR round >= 1),
    raw TEXT,
    opened_at REAL NOT NULL
) STRICT;

-- The journaled batch: each proposed call advances planned -> started -> completed; a completed call holds the exact
-- tool_result payload (`result`, canonical JSON) and the asset references it links (`assets`, JSON, or NULL).
CREATE TABLE agent_calls (
    session_id INTEGER NOT NULL REFERENCES agent_turns (session_id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL CHECK (ordinal >= 0),
    call_id TEXT NOT NULL UNIQUE CHECK (length(call_id) BETWEEN 1 AND 64),
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('planned', 'started', 'completed')),
    result TEXT CHECK ((state = 'completed') = (result IS NOT NULL)),
    assets TEXT,
    planned_at REAL NOT NULL,
    started_at REAL,                                    -- set when the call started (never for one that did not run)
    completed_at REAL,
    PRIMARY KEY (session_id, ordinal)
) STRICT;
