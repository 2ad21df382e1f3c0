-- When a Knowledge version's statement was said: the time of the source event it was taken from (a distillation
-- names it; otherwise the last event of the provenance range), or, without provenance, when the version was written.
-- A tombstone keeps the said_at of the version it retires. Existing versions take the time of the last event of
-- their provenance range while that Session is stored, else their own created_at.
ALTER TABLE knowledge_versions ADD COLUMN said_at REAL;

UPDATE knowledge_versions SET said_at = coalesce(
    (SELECT e.created_at FROM events e
     WHERE e.session_id = knowledge_versions.source_session_id AND e.seq = knowledge_versions.source_last_seq),
    created_at);

-- Versions stay immutable: said_at joins the columns no UPDATE may change.
DROP TRIGGER knowledge_versions_immutable;
CREATE TRIGGER knowledge_versions_immutable
BEFORE UPDATE OF id, knowledge_id, version, tombstone, content, size, confidence, origin, source_session_uuid,
    source_first_seq, source_last_seq, source_digest, created_at, client, said_at ON knowledge_versions
BEGIN SELECT RAISE(ABORT, 'Knowledge versions are immutable'); END;

CREATE TRIGGER knowledge_versions_said_at_required
BEFORE INSERT ON knowledge_versions WHEN NEW.said_at IS NULL
BEGIN SELECT RAISE(ABORT, 'a Knowledge version needs said_at'); END;
