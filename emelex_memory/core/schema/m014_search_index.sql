-- Full-text search over each workspace's live Knowledge and its Sessions' transcripts (see search/service.py).
-- The index is written by triggers, so every write path (append, Summary, upsert, tombstone, delete_session,
-- retention, a foreign-key cascade) updates it in the same transaction as what it indexes. `ws` holds the token
-- 'w<workspace id>', which scopes a query to one workspace inside the index.

-- What is indexed of an event: the text of a user message, an answer or a Summary; a tool call's name and
-- arguments; a tool result's output; the first 8192 characters of it. Other kinds are not indexed.
CREATE VIEW event_search_source AS
SELECT e.id AS id, 'w' || s.workspace_id AS ws, substr(CASE
    WHEN NOT json_valid(e.payload) THEN NULL
    WHEN e.kind IN ('user', 'assistant', 'summary') THEN
        CASE WHEN json_type(e.payload, '$.text') = 'text' THEN json_extract(e.payload, '$.text') END
    WHEN e.kind = 'tool_calls' THEN
        (SELECT group_concat(t.value, ' ') FROM json_tree(e.payload, '$.calls') t
         WHERE t.type = 'text' AND t.key IS NOT 'call_id')
    WHEN e.kind = 'tool_result' THEN
        (SELECT group_concat(t.value, ' ') FROM json_tree(e.payload, '$.output') t WHERE t.type = 'text')
    END, 1, 8192) AS body
FROM events e JOIN sessions s ON s.id = e.session_id;

-- What is indexed of Knowledge: the key and content of the head version of each entry that is not a tombstone.
CREATE VIEW knowledge_search_source AS
SELECT k.id AS id, 'w' || k.workspace_id AS ws, k.key AS key, v.content AS content
FROM knowledge k JOIN knowledge_versions v ON v.knowledge_id = k.id AND v.version = k.head_version
WHERE k.tombstoned_at IS NULL AND v.content IS NOT NULL;

-- rowid = events.id and knowledge.id. 'secure-delete' removes a deleted row's terms from the index itself, so the
-- words of a deleted Session do not linger in the index's pages.
CREATE VIRTUAL TABLE event_search USING fts5(ws, body, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO event_search (event_search, rank) VALUES ('secure-delete', 1);
CREATE VIRTUAL TABLE knowledge_search USING fts5(ws, key, content, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO knowledge_search (knowledge_search, rank) VALUES ('secure-delete', 1);

CREATE TRIGGER event_search_insert AFTER INSERT ON events BEGIN
    INSERT INTO event_search (rowid, ws, body)
    SELECT id, ws, body FROM event_search_source WHERE id = NEW.id AND body <> '';
END;
CREATE TRIGGER event_search_update AFTER UPDATE OF kind, payload ON events BEGIN
    DELETE FROM event_search WHERE rowid = OLD.id;
    INSERT INTO event_search (rowid, ws, body)
    SELECT id, ws, body FROM event_search_source WHERE id = NEW.id AND body <> '';
END;
CREATE TRIGGER event_search_delete AFTER DELETE ON events BEGIN
    DELETE FROM event_search WHERE rowid = OLD.id;
END;
CREATE TRIGGER event_search_session_moved AFTER UPDATE OF workspace_id ON sessions
WHEN OLD.workspace_id IS NOT NEW.workspace_id BEGIN
    DELETE FROM event_search WHERE rowid IN (SELECT id FROM events WHERE session_id = NEW.id);
    INSERT INTO event_search (rowid, ws, body)
    SELECT id, ws, body FROM event_search_source
    WHERE id IN (SELECT id FROM events WHERE session_id = NEW.id) AND body <> '';
END;

-- An entry is reindexed once per change of what its head says: when the head version's row is written or removed,
-- or when the entry's key, workspace, head or tombstone changes while its head version's row exists. Writing the
-- next version moves the head before inserting its row, so only that insert reindexes; pruning older versions
-- and a cascade from a deleted entry reindex nothing.
CREATE TRIGGER knowledge_search_version_insert AFTER INSERT ON knowledge_versions
WHEN NEW.version = (SELECT head_version FROM knowledge WHERE id = NEW.knowledge_id) BEGIN
    DELETE FROM knowledge_search WHERE rowid = NEW.knowledge_id;
    INSERT INTO knowledge_search (rowid, ws, key, content)
    SELECT id, ws, key, content FROM knowledge_search_source WHERE id = NEW.knowledge_id;
END;
CREATE TRIGGER knowledge_search_version_delete AFTER DELETE ON knowledge_versions
WHEN OLD.version = (SELECT head_version FROM knowledge WHERE id = OLD.knowledge_id) BEGIN
    DELETE FROM knowledge_search WHERE rowid = OLD.knowledge_id;
    INSERT INTO knowledge_search (rowid, ws, key, content)
    SELECT id, ws, key, content FROM knowledge_search_source WHERE id = OLD.knowledge_id;
END;
CREATE TRIGGER knowledge_search_update AFTER UPDATE OF workspace_id, key, head_version, tombstoned_at ON knowledge
WHEN (OLD.workspace_id IS NOT NEW.workspace_id OR OLD.key IS NOT NEW.key OR OLD.head_version IS NOT NEW.head_version
      OR OLD.tombstoned_at IS NOT NEW.tombstoned_at)
    AND EXISTS (SELECT 1 FROM knowledge_versions WHERE knowledge_id = NEW.id AND version = NEW.head_version) BEGIN
    DELETE FROM knowledge_search WHERE rowid = OLD.id;
    INSERT INTO knowledge_search (rowid, ws, key, content)
    SELECT id, ws, key, content FROM knowledge_search_source WHERE id = NEW.id;
END;
CREATE TRIGGER knowledge_search_delete AFTER DELETE ON knowledge BEGIN
    DELETE FROM knowledge_search WHERE rowid = OLD.id;
END;

-- The index of an existing store, built by streaming statements (FTS5 flushes its pending terms as it goes).
INSERT INTO event_search (rowid, ws, body) SELECT id, ws, body FROM event_search_source WHERE body <> '';
INSERT INTO knowledge_search (rowid, ws, key, content) SELECT id, ws, key, content FROM knowledge_search_source;
