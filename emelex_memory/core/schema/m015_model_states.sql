
CREATE TABLE model_states (
    -- a Session's saved model state (a model's evaluated context), stored as an asset; at most one per state key
    session_id INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    state_key TEXT NOT NULL CHECK (length(state_key) = 64),   -- SHA-256 hex of the model, template and context settings
    prefix_tokens INTEGER NOT NULL CHECK (prefix_tokens > 0),  -- tokens the state has evaluated
    prefix_digest TEXT NOT NULL CHECK (length(prefix_digest) = 64),  -- SHA-256 hex of those tokens
    digest TEXT NOT NULL,
    media_kind TEXT NOT NULL,
    size INTEGER NOT NULL CHECK (size >= 0),
    saved_at REAL NOT NULL,
    PRIMARY KEY (session_id, state_key),
    FOREIGN KEY (digest, media_kind) REFERENCES assets (digest, media_kind)  -- a named asset is never collected
) STRICT;
CREATE INDEX model_states_by_asset ON model_states (digest, media_kind);
CREATE INDEX model_states_by_age ON model_states (saved_at);
