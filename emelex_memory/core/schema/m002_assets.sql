
CREATE TABLE assets (
    -- lowercase SHA-256 hex of the bytes, and the name of their file
    digest TEXT NOT NULL CHECK (length(digest) = 64 AND digest NOT GLOB '*[^0-9a-f]*'),
    media_kind TEXT NOT NULL CHECK (length(media_kind) BETWEEN 3 AND 127),              -- e.g. image/png
    size INTEGER NOT NULL CHECK (size BETWEEN 0 AND 134217728),   -- bytes; the same for every kind of one digest
    links INTEGER NOT NULL DEFAULT 0 CHECK (links >= 0),          -- event_assets rows naming it (kept by triggers)
    created_at REAL NOT NULL,
    touched_at REAL NOT NULL,            -- last put or link; unreferenced entries are collectable a grace period later
    PRIMARY KEY (digest, media_kind)
) STRICT, WITHOUT ROWID;
CREATE INDEX assets_collectable ON assets (touched_at) WHERE links = 0;

CREATE TABLE event_assets (
    session_id INTEGER NOT NULL,         -- (session_id, seq) is the linking event
    seq INTEGER NOT NULL,
    ordinal INTEGER NOT NULL CHECK (ordinal BETWEEN 0 AND 63),    -- position in the event's asset list
    digest TEXT NOT NULL,
    media_kind TEXT NOT NULL,
    PRIMARY KEY (session_id, seq, ordinal),
    FOREIGN KEY (session_id, seq) REFERENCES events (session_id, seq) ON DELETE CASCADE,
    FOREIGN KEY (digest, media_kind) REFERENCES assets (digest, media_kind)  -- a linked entry cannot be deleted
) STRICT, WITHOUT ROWID;
CREATE INDEX event_assets_by_asset ON event_assets (digest, media_kind);

CREATE TRIGGER event_assets_counted AFTER INSERT ON event_assets BEGIN
    UPDATE assets SET links = links + 1 WHERE digest = NEW.digest AND media_kind = NEW.media_kind;
END;
CREATE TRIGGER event_assets_uncounted AFTER DELETE ON event_assets BEGIN
    UPDATE assets SET links = links - 1 WHERE digest = OLD.digest AND media_kind = OLD.media_kind;
END;

-- The event's own record of its assets, [[digest, size, media_kind], ...] in ordinal order; NULL when it has
-- none. Replay checks it against event_assets and the catalog.
ALTER TABLE events ADD COLUMN asset_refs TEXT CHECK (
    asset_refs IS NULL OR (json_valid(asset_refs) AND json_type(asset_refs) = 'array'
                           AND json_array_length(asset_refs) BETWEEN 1 AND 64)
);
