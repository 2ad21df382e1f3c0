
-- The processes a started call's tool started that may outlive the process running the tool (`run_command`'s shell,
-- or any process a tool records through `ToolInvocation.track_process`): a JSON array of `ProcessRecord` objects
-- (pid, process group, start time, boot identity, label; `emelex_memory.agent.processes`), NULL when none. Recovery
-- refuses to settle the call's effect while one of them runs.
ALTER TABLE agent_calls ADD COLUMN processes TEXT;
