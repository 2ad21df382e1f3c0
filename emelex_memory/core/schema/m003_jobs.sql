
CREATE TABLE jobs (
    id INTEGER PRIMARY KEY,              -- internal key; list cursors page by it
    uuid TEXT NOT NULL UNIQUE,           -- the public job ID; never changes, not even on retry
    kind TEXT NOT NULL CHECK (length(kind) BETWEEN 1 AND 32),   -- a registered job kind, e.g. 'compaction'
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    source_key TEXT NOT NULL CHECK (length(source_key) BETWEEN 1 AND 128),  -- idempotency key within (kind, Session)
    source TEXT NOT NULL CHECK (length(source) <= 16384),   -- canonical JSON: the exact description of the work
    state TEXT NOT NULL CHECK (state = 'pending' OR state = 'claimed' OR state = 'done' OR state = 'failed'
                               OR state = 'cancelled'),  -- no IN list: see the note below the table
    attempts INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),  -- failed attempts; reset only by retry_failed_job
    due_at REAL NOT NULL,                -- next attention: pending, the retry deadline; claimed, the lease expiry
    lease_hash BLOB CHECK (lease_hash IS NULL OR length(lease_hash) = 32),  -- SHA-256 of the worker lease token
    lease_holder TEXT CHECK (lease_holder IS NULL OR length(lease_holder) <= 200),  -- "pid@host", diagnostics only
    lease_expires_at REAL,               -- a claim past this is rescued by the next claim as a counted failure
    diagnostics TEXT NOT NULL DEFAULT '[]' CHECK (length(diagnostics) <= 8192),  -- canonical JSON list, newest last
    result TEXT CHECK (result IS NULL OR length(result) <= 16384),  -- canonical JSON outcome of a done job
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL,                    -- when the job became done, failed or cancelled
    UNIQUE (kind, session_id, source_key),
    CHECK ((state = 'claimed') =
           (lease_hash IS NOT NULL AND lease_holder IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CHECK (state != 'claimed' OR due_at = lease_expires_at),  -- one index orders retry deadlines and lease expiries
    CHECK ((state = 'done' OR state = 'failed' OR state = 'cancelled') = (finished_at IS NOT NULL)),
    CHECK (state = 'done' OR result IS NULL)
) STRICT;
-- The CHECKs spell state tests out with OR: SQLite evaluates an IN list of three or more constants through a
-- temporary b-tree it builds on every execution of a statement, a fixed cost on each queue transition.
CREATE INDEX jobs_active ON jobs (state, due_at, id) WHERE state IN ('pending', 'claimed');
CREATE INDEX jobs_by_session ON jobs (session_id, kind);  -- no state: transitions leave it untouched

CREATE TABLE summaries (
    event_id INTEGER PRIMARY KEY REFERENCES events (id) ON DELETE CASCADE,  -- the Summary event itself
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    job_id INTEGER NOT NULL REFERENCES jobs (id),  -- the compaction job; it cannot be deleted while this row exists
    base_event_id INTEGER,               -- the Summary this one compacted again; NULL for a Session's first
    through_seq INTEGER NOT NULL CHECK (through_seq >= 1),  -- newest raw seq covered; replay shows later events
    source_count INTEGER NOT NULL CHECK (source_count >= 1),  -- events in the source prefix (base Summary included)
    first_event_id INTEGER NOT NULL,
    last_event_id INTEGER NOT NULL,
    source_digest BLOB NOT NULL CHECK (length(source_digest) = 32),    -- see prefix_digest.py
    summary_digest BLOB NOT NULL CHECK (length(summary_digest) = 32),  -- over the Summary event's payload bytes
    model_ref TEXT CHECK (model_ref IS NULL OR length(model_ref) <= 512),  -- model snapshot reference, when known
    created_at REAL NOT NULL
) STRICT;
CREATE INDEX summaries_by_session ON summaries (session_id, event_id);
