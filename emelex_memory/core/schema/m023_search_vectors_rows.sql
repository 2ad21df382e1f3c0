-- search_vectors rebuilt as a rowid table. In the WITHOUT ROWID table of m019 a vector of 384 numbers (1.5 KiB)
-- spilled into an overflow page (4.5 KiB a row on disk; here it fits its b-tree page), and its primary key led with
-- the model, so each trigger deleting the vectors of a changed or deleted row scanned the whole table: here the
-- unique key (item, item_id, model) finds them. The vectors are copied, the triggers recreated as they were.
DROP TRIGGER search_vectors_event_changed;
DROP TRIGGER search_vectors_event_deleted;
DROP TRIGGER search_vectors_session_moved;
DROP TRIGGER search_vectors_version_written;
DROP TRIGGER search_vectors_version_deleted;
DROP TRIGGER search_vectors_knowledge_changed;
DROP TRIGGER search_vectors_knowledge_deleted;
ALTER TABLE search_vectors RENAME TO search_vectors_m019;
CREATE TABLE search_vectors (
    id INTEGER PRIMARY KEY,              -- a search reads a workspace's vectors in this order, in pages
    item TEXT NOT NULL CHECK (item IN ('event', 'knowledge')),  -- which index: event_search or knowledge_search
    item_id INTEGER NOT NULL,            -- events.id or knowledge.id (the index's rowid)
    model TEXT NOT NULL CHECK (length(model) BETWEEN 1 AND 200),  -- the embedder's model name
    workspace_id INTEGER NOT NULL REFERENCES workspaces (id) ON DELETE CASCADE,
    digest BLOB NOT NULL,                -- SHA-256 of the text embedded (checked against the row when written)
    vector BLOB NOT NULL CHECK (length(vector) BETWEEN 4 AND 65536 AND length(vector) % 4 = 0),  -- float32, LE
    UNIQUE (item, item_id, model)
) STRICT;
INSERT INTO search_vectors (item, item_id, model, workspace_id, digest, vector)
SELECT item, item_id, model, workspace_id, digest, vector FROM search_vectors_m019
ORDER BY workspace_id, model, item, item_id;
DROP TABLE search_vectors_m019;
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
