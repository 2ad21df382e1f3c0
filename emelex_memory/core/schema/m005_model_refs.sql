
CREATE TABLE session_model_refs (
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    snapshot_id TEXT NOT NULL CHECK (length(snapshot_id) = 71 AND substr(snapshot_id, 1, 7) = 'sha256:'),
        -- exact installed snapshot: SHA-256 of its canonical manifest
    reference TEXT NOT NULL CHECK (length(reference) BETWEEN 73 AND 200),  -- stable "<name>@sha256:<content>"
    first_bound_at REAL NOT NULL,
    last_bound_at REAL NOT NULL CHECK (last_bound_at >= first_bound_at),
    PRIMARY KEY (session_id, snapshot_id)
) STRICT;
CREATE INDEX session_model_refs_by_snapshot ON session_model_refs (snapshot_id, session_id);
