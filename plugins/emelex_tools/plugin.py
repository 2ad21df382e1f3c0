"""The built-in "tools" plugin: read_file, list_dir, search_text (no approval), write_file, edit_file and
run_command (every call approved by the user, who sees the diff of a file's change or the command and its directory
first: `edits`). File tools are confined to the Session's workspace; see `paths`. Their `path`
arguments are declared workspace paths, so each round's grammar offers only what exists (a new file's name under
an existing directory for write_file)."""

from __future__ import annotations

from emelex_workers.plugin_api import ToolSpec
from emelex_workers.hookspecs import hookimpl

from .command import TIMEOUT_S, run_command
from .edits import command_preview, edit_file, edit_preview, write_new_or_replace, write_preview
from .files import list_dir, read_file, search_text
from .paths import MAX_PATH_CHARS

NAME = "tools"
MAX_CONTENT_CHARS = 1000
PATH = {"type": "string", "maxLength": MAX_PATH_CHARS, "description": "relative to the workspace"}


# the verbs a request that asks for the tool's effect begins a clause with (`ToolSpec.requested_by`)
WRITE_WORDS = frozenset({"create", "write", "make", "save", "add", "append", "change", "edit", "update", "modify",
                         "replace", "put", "insert", "generate", "fix", "rename", "overwrite", "store", "empty",
                         "clear", "remove", "delete", "rewrite", "copy", "bump", "set", "increment", "mark"})
RUN_WORDS = frozenset({"run", "execute", "exec", "launch", "start", "compile", "build", "test", "install", "invoke",
                       "rerun"})


def _object(required: list[str], **properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def tool_specs() -> list[ToolSpec]:
    """The six built-in tools."""
    return [
        ToolSpec("read_file", "Read a text file in the workspace.", _object(["path"], path=PATH), read_file,
                 approval="never", workspace_paths={"path": "file"}),
        ToolSpec("list_dir", "List a directory in the workspace (\".\" is the workspace).",
                 _object(["path"], path=PATH), list_dir, approval="never", workspace_paths={"path": "directory"}),
        ToolSpec("search_text", "Find lines containing a text in the workspace's files.",
                 _object(["text"], text={"type": "string", "minLength": 1, "maxLength": 200}, path=PATH),
                 search_text, approval="never", workspace_paths={"path": "directory"}),
        ToolSpec("write_file", "Create a text file in the workspace (an existing one only with replace: true; to "
                 "change part of a file use edit_file).",
                 _object(["path", "content"], path=PATH, content={"type": "string", "maxLength": MAX_CONTENT_CHARS},
                         replace={"type": "boolean", "description": "true to replace an existing file"}),
                 write_new_or_replace, approval="always", workspace_paths={"path": "new"}, requested_by=WRITE_WORDS,
                 request_spans={"content": "text"}, preview=write_preview),
        ToolSpec("edit_file", "Change an existing text file: replace the exact text old (found once) with new, or "
                 "with no old, append new as a line at the end.",
                 _object(["path", "new"], path=PATH, old={"type": "string", "maxLength": MAX_CONTENT_CHARS},
                         new={"type": "string", "maxLength": MAX_CONTENT_CHARS}),
                 edit_file, approval="always", workspace_paths={"path": "file"}, requested_by=WRITE_WORDS,
                 request_spans={"new": "text", "old": "held"},
                 preview=edit_preview),
        ToolSpec("run_command", f"Run a shell command in the workspace (stopped after {TIMEOUT_S} s).",
                 _object(["command"], command={"type": "string", "minLength": 1, "maxLength": 500}), run_command,
                 approval="always", requested_by=RUN_WORDS, request_spans={"command": "command"},
                 preview=command_preview),
    ]


@hookimpl
def register_tools(register) -> None:
    """Register the built-in tools."""
    for spec in tool_specs():
        register(spec)
