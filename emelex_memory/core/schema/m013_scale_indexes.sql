
CREATE INDEX session_leases_active ON session_leases (expires_at) WHERE state = 'active';
ALTER TABLE knowledge ADD COLUMN first_version INTEGER NOT NULL DEFAULT 1 CHECK (first_version >= 1);
UPDATE knowledge SET first_version = coalesce(
    (SELECT min(version) FROM knowledge_versions v WHERE v.knowledge_id = knowledge.id), 1);
CREATE INDEX knowledge_prunable ON knowledge (head_version - first_version) WHERE pinned = 0;
CREATE INDEX jobs_due ON jobs (due_at, id) WHERE state = 'pending';
