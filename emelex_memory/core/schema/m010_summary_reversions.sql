
-- A reverted Summary stays stored with its provenance, and replay skips it (see compaction/revert.py). The Summaries
-- in effect are indexed by event ID (replay starts from the newest) and by covered seq (which one covers an event).
ALTER TABLE summaries ADD COLUMN reverted_at REAL;  -- NULL while in effect; when it was reverted (a redo clears it)
CREATE INDEX summaries_in_effect ON summaries (session_id, event_id) WHERE reverted_at IS NULL;
CREATE INDEX summaries_in_effect_by_seq ON summaries (session_id, through_seq) WHERE reverted_at IS NULL;
