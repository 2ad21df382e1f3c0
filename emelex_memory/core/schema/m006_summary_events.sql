
-- A Session's Summary events by seq: replay finds the newest one (or learns there is none) with one probe, so a
-- Summary event whose provenance record is missing cannot be skipped unnoticed.
CREATE INDEX events_summaries ON events (session_id, seq) WHERE kind = 'summary';
