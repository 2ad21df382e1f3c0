-- A Session's title and date, searchable (see search/ranking.py): one row per Session, rowid = sessions.id, written
-- by triggers in the transaction that creates, renames, moves or deletes the Session. `head` is the title, then the
-- date the Session was created (UTC) spelled as "2023-05-07 May 2023 Sunday", so "May", "2023" or "Sunday" finds it.
CREATE VIEW session_search_source AS
SELECT s.id AS id, 'w' || s.workspace_id AS ws, trim(coalesce(s.title, '') || ' ' ||
    strftime('%Y-%m-%d', s.created_at, 'unixepoch') || ' ' ||
    CASE strftime('%m', s.created_at, 'unixepoch') WHEN '01' THEN 'January' WHEN '02' THEN 'February'
        WHEN '03' THEN 'March' WHEN '04' THEN 'April' WHEN '05' THEN 'May' WHEN '06' THEN 'June'
        WHEN '07' THEN 'July' WHEN '08' THEN 'August' WHEN '09' THEN 'September' WHEN '10' THEN 'October'
        WHEN '11' THEN 'November' ELSE 'December' END || ' ' || strftime('%Y', s.created_at, 'unixepoch') || ' ' ||
    CASE strftime('%w', s.created_at, 'unixepoch') WHEN '0' THEN 'Sunday' WHEN '1' THEN 'Monday'
        WHEN '2' THEN 'Tuesday' WHEN '3' THEN 'Wednesday' WHEN '4' THEN 'Thursday' WHEN '5' THEN 'Friday'
        ELSE 'Saturday' END) AS head
FROM sessions s;

CREATE VIRTUAL TABLE session_search USING fts5(ws, head, tokenize = 'porter unicode61 remove_diacritics 2');
INSERT INTO session_search (session_search, rank) VALUES ('secure-delete', 1);

CREATE TRIGGER session_search_insert AFTER INSERT ON sessions BEGIN
    INSERT INTO session_search (rowid, ws, head) SELECT id, ws, head FROM session_search_source WHERE id = NEW.id;
END;
CREATE TRIGGER session_search_update AFTER UPDATE OF title, workspace_id, created_at ON sessions
WHEN OLD.title IS NOT NEW.title OR OLD.workspace_id IS NOT NEW.workspace_id OR OLD.created_at IS NOT NEW.created_at
BEGIN
    DELETE FROM session_search WHERE rowid = OLD.id;
    INSERT INTO session_search (rowid, ws, head) SELECT id, ws, head FROM session_search_source WHERE id = NEW.id;
END;
CREATE TRIGGER session_search_delete AFTER DELETE ON sessions BEGIN
    DELETE FROM session_search WHERE rowid = OLD.id;
END;

INSERT INTO session_search (rowid, ws, head) SELECT id, ws, head FROM session_search_source;
