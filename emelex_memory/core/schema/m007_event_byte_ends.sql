
-- Each event records the Session's transcript bytes through itself, so the Session head (newest seq and turn,
-- total bytes, last activity) is read from its newest event: an append writes its events and nothing else, and a
-- replay page's byte total is its last byte_end minus its first byte_end plus its first size.
ALTER TABLE events ADD COLUMN byte_end INTEGER NOT NULL DEFAULT 0 CHECK (byte_end >= 0);
UPDATE events SET byte_end = w.total
    FROM (SELECT id, sum(size) OVER (PARTITION BY session_id ORDER BY seq) AS total FROM events) AS w
    WHERE events.id = w.id;
ALTER TABLE sessions DROP COLUMN last_seq;
ALTER TABLE sessions DROP COLUMN last_turn;
ALTER TABLE sessions DROP COLUMN event_bytes;
-- The events that record assets, so a replay page learns with one probe that none of its events has any.
CREATE INDEX events_with_assets ON events (session_id, seq) WHERE asset_refs IS NOT NULL;
-- Appends no longer touch sessions.updated_at; the view's updated_at is the later of it and the newest event.
CREATE VIEW session_heads AS
SELECT s.id AS id, s.uuid AS uuid, s.title AS title, s.workspace_path AS workspace_path,
       s.workspace_dev AS workspace_dev, s.workspace_ino AS workspace_ino, s.created_at AS created_at,
       max(s.updated_at, coalesce(e.created_at, s.updated_at)) AS updated_at,
       coalesce(e.seq, 0) AS last_seq, coalesce(e.turn, 0) AS last_turn, coalesce(e.byte_end, 0) AS event_bytes
FROM sessions s LEFT JOIN events e ON e.id = (SELECT id FROM events WHERE session_id = s.id ORDER BY seq DESC LIMIT 1);
