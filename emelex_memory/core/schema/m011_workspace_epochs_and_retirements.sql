
-- A Session's workspace_epoch counts the changes of its workspace's row (a rename followed, a component recorded, a
-- rebind), so that an append, which reads the Session row anyway, tells that the workspace its lease verified is
-- unchanged from two integers, without reading the workspace row.
ALTER TABLE sessions ADD COLUMN workspace_epoch INTEGER NOT NULL DEFAULT 0;
-- A directory at the path of a known workspace it is not (a re-clone) is told apart from a new one by this lookup.
CREATE INDEX workspaces_by_path ON workspaces (path);
-- A rebind onto a directory that already is an empty workspace (no Sessions, no Knowledge, no rebinds of its own)
-- retires that row: its ID is recorded here, as the row itself is deleted.
ALTER TABLE workspace_rebinds ADD COLUMN retired_workspace_id INTEGER;
CREATE TRIGGER workspace_changed AFTER UPDATE OF path, device, inode, generation, birth_ns ON workspaces
WHEN OLD.path IS NOT NEW.path OR OLD.device IS NOT NEW.device OR OLD.inode IS NOT NEW.inode
     OR OLD.generation IS NOT NEW.generation OR OLD.birth_ns IS NOT NEW.birth_ns
BEGIN
    UPDATE sessions SET workspace_epoch = workspace_epoch + 1 WHERE workspace_id = NEW.id;
END;
