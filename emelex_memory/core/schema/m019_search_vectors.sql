-- Vectors of what the search index holds, written by an embedder outside the writes they embed (see
-- search/vectors.py), and deleted by triggers in the transaction that changes or deletes what they embed, so a
-- vector never outlives its text: a search reads only vectors whose row is as it was embedded.
CREATE TABLE search_vectors (
    item TEXT NOT NULL CHECK (item IN ('event', 'knowledge')),  -- which index: event_search or knowledge_search
    item_id INTEGER NOT NULL,            -- events.id or knowledge.id (the index's rowid)
    model TEXT NOT NULL CHECK (length(model) BETWEEN 1 AND 200),  -- the embedder's model name
    workspace_id INTEGER NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    digest BLOB NOT NULL,                -- SHA-256 of the text embedded (checked against the row when written)
    vector BLOB NOT NULL CHECK (length(vector) BETWEEN 4 AND 65536 AND length(vector) % 4 = 0),  -- float32, LE
    PRIMARY KEY (model, item, item_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX search_vectors_by_workspace ON search_vectors (workspace_id, model);

CREATE TRIGGER search_vectors_event_changed AFTER UPDATE OF kind, payload ON events BEGIN
    DELETE FROM search_vectors WHERE item = 'event' AND item_id = OLD.id;
END;
CREATE TRIGGER search_vectors_event_deleted AFTER DELETE ON events BEGIN
    DELETE FROM search_vectors WHERE item = 'event' AND item_id = OLD.id;
END;
CREATE TRIGGER search_vectors_session_moved AFTER UPDATE OF workspace_id ON sessions
WHEN OLD.workspace_id IS NOT NEW.workspace_id BEGIN
    DELETE FROM search_vectors WHERE item = 'event' AND item_id IN (SELECT id FROM events WHERE session_id = NEW.id);
END;
CREATE TRIGGER search_vectors_version_written AFTER INSERT ON knowledge_versions BEGIN
    DELETE FROM search_vectors WHERE item = 'knowledge' AND item_id = NEW.knowledge_id;
END;
CREATE TRIGGER search_vectors_version_deleted AFTER DELETE ON knowledge_versions BEGIN
    DELETE FROM search_vectors WHERE item = 'knowledge' AND item_id = OLD.knowledge_id;
END;
CREATE TRIGGER search_vectors_knowledge_changed AFTER UPDATE OF workspace_id, key, head_version, tombstoned_at
ON knowledge BEGIN
    DELETE FROM search_vectors WHERE item = 'knowledge' AND item_id = OLD.id;
END;
CREATE TRIGGER search_vectors_knowledge_deleted AFTER DELETE ON knowledge BEGIN
    DELETE FROM search_vectors WHERE item = 'knowledge' AND item_id = OLD.id;
END;
