
-- Which plugin produced a Summary or a Knowledge version (`emelex_memory.core.producer`): canonical JSON naming the
-- plugin's entry point, its distribution and version, the summarizer's or distiller's name and mode, e.g.
-- {"distribution":"emelex-notes","kind":"summarizer","mode":"extractive","name":"notes","plugin":"notes",
-- "version":"0.1.0"}; NULL when not recorded (written before this step, or not by the worker).
ALTER TABLE summaries ADD COLUMN producer TEXT CHECK (producer IS NULL OR length(producer) BETWEEN 2 AND 2048);
ALTER TABLE knowledge_versions ADD COLUMN producer TEXT
    CHECK (producer IS NULL OR length(producer) BETWEEN 2 AND 2048);
DROP TRIGGER knowledge_versions_immutable;
CREATE TRIGGER knowledge_versions_immutable
BEFORE UPDATE OF id, knowledge_id, version, tombstone, content, size, confidence, origin, source_session_uuid,
    source_first_seq, source_last_seq, source_digest, created_at, client, producer ON knowledge_versions
BEGIN SELECT RAISE(ABORT, 'Knowledge versions are immutable'); END;
