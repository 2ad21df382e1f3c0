"""Changing a file a person can see before approving it: `edit_file` (replace an exact text, or append), the rule
that `write_file` replaces an existing file only when the call says so (`replace`), and the previews the chat
shows at a call's approval prompt instead of its arguments: a unified diff of the file's change, or the command
and its working directory.

A preview reads the workspace as the tool would (confined, no symlink
followed) and changes nothing; it shows what the call would do now, and the
tool checks again when it runs.
"""

from __future__ import annotations

import difflib
import os

from emelex_workers.plugin_api import ToolInvocation, ToolOutput

from .files import READ_CAP, _read, replace_file, write_file
from .paths import WorkspacePathError, open_regular

DIFF_LINES = 60  # lines of a preview's diff shown at most
DIFF_CONTEXT = 2  # unchanged lines around each change


class EditError(WorkspacePathError):
    """An edit cannot be applied as asked (the text to replace is missing or not unique, or a file would be
    replaced without `replace`); the message says which, and the file is unchanged."""


def current_text(invocation: ToolInvocation, path: str) -> str | None:
    """The text of workspace file `path` now (UTF-8, undecodable bytes replaced), None when there is none;
    `WorkspacePathError` for a path that is refused or not a regular file."""
    try:
        with open_regular(invocation.workspace, path) as fd:
            if os.fstat(fd).st_size > READ_CAP:
                raise EditError(f"{path} is larger than {READ_CAP} bytes; it cannot be edited here")
            return _read(fd, READ_CAP).decode("utf-8", "replace")
    except WorkspacePathError as exc:
        if exc.missing:
            return None
        raise


def edited(text: str, path: str, old: str, new: str) -> str:
    """`text` with `old` replaced by `new` when `old` is given (it must occur exactly once), else with `new`
    appended as its last line(s) (after a line break when `text` does not end with one; `new` ends with one);
    `EditError` when `old` is not in `text` or more than once."""
    if old:
        count = text.count(old)
        if count == 0:
            raise EditError(f"the text to replace is not in {path}; read the file and give its exact text")
        if count > 1:
            raise EditError(f"the text to replace occurs {count} times in {path}; give a longer text that occurs "
                            "once")
        return text.replace(old, new, 1)
    if not new:
        raise EditError("nothing to append: give the text to add as new")
    head = text if not text or text.endswith("\n") else text + "\n"
    return head + (new if new.endswith("\n") else new + "\n")


def edit_file(invocation: ToolInvocation) -> ToolOutput:
    """Change an existing workspace file: replace the exact text `old` (which must occur once) with `new`, or, with
    no `old`, append `new` as a line at the end; written atomically (`replace_file`). An error, the file unchanged,
    when the text is not found or not unique."""
    path = invocation.arguments["path"]
    old, new = invocation.arguments.get("old", ""), invocation.arguments.get("new", "")
    text = current_text(invocation, path)
    if text is None:
        raise EditError(f"{path} does not exist; create it with write_file")
    result = edited(text, path, old, new)
    replace_file(invocation.workspace, path, result.encode("utf-8"), invocation.call_id)
    what = "replaced 1 occurrence" if old else "appended"
    return ToolOutput(f"{path}: {what} ({len(text.splitlines())} -> {len(result.splitlines())} lines)")


def write_new_or_replace(invocation: ToolInvocation) -> ToolOutput:
    """`write_file`: create a workspace file, or replace an existing one only when `replace` is true (so that a
    call meant to add to a file cannot silently destroy it); an error, nothing written, otherwise."""
    path = invocation.arguments["path"]
    if not invocation.arguments.get("replace") and current_text(invocation, path) is not None:
        raise EditError(f"{path} exists; to change part of it use edit_file, or set replace to true to replace "
                        "all of it")
    return write_file(invocation)


def diff(path: str, before: str | None, after: str) -> str:
    """A unified diff of `path` from `before` (None: a new file) to `after`, at most `DIFF_LINES` lines."""
    lines = list(difflib.unified_diff((before or "").splitlines(), after.splitlines(),
                                      "/dev/null" if before is None else f"a/{path}", f"b/{path}",
                                      n=DIFF_CONTEXT, lineterm=""))
    if not lines:
        return f"{path}: no change"
    more = len(lines) - DIFF_LINES
    return "\n".join(lines[:DIFF_LINES] + ([f"... ({more} more lines of the diff)"] if more > 0 else []))


def write_preview(invocation: ToolInvocation) -> str:
    """What a `write_file` call would do: the diff of a new file, or of an existing one it replaces (or why it
    would be refused)."""
    path, content = invocation.arguments["path"], invocation.arguments["content"]
    before = current_text(invocation, path)
    if before is not None and not invocation.arguments.get("replace"):
        return f"write_file {path}: refused: the file exists and replace is not set (nothing would change)"
    head = f"write_file {path} ({'new file' if before is None else 'replaces the whole file'}):"
    return f"{head}\n{diff(path, before, content)}"


def edit_preview(invocation: ToolInvocation) -> str:
    """What an `edit_file` call would do: the diff of its change (or why it would fail)."""
    path = invocation.arguments["path"]
    old, new = invocation.arguments.get("old", ""), invocation.arguments.get("new", "")
    before = current_text(invocation, path)
    if before is None:
        return f"edit_file {path}: would fail: the file does not exist"
    try:
        after = edited(before, path, old, new)
    except EditError as exc:
        return f"edit_file {path}: would fail: {exc}"
    return f"edit_file {path} ({'replace' if old else 'append'}):\n{diff(path, before, after)}"


def command_preview(invocation: ToolInvocation) -> str:
    """What a `run_command` call would run, and where."""
    return f"run_command: $ {invocation.arguments['command']}\n  in {invocation.workspace}"
