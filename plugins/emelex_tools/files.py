"""The file tools: read_file, list_dir, search_text and write_file, all confined with `paths`."""

from __future__ import annotations

import os
import stat

from emelex_memory import write_all
from emelex_workers.plugin_api import ToolInvocation, ToolOutput

from .paths import WorkspacePathError, open_regular, parts_of, split, workspace_dir

READ_CAP = 1024 * 1024  # bytes read_file reads at most (more is reported, not read)
LIST_CAP = 500  # entries list_dir shows at most
SEARCH_FILES = 2000  # files search_text looks at, at most
SEARCH_FILE_BYTES = 1024 * 1024  # bytes of one file search_text reads, at most
SEARCH_MATCHES = 100  # matching lines search_text reports, at most
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv"}


def _read(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_file(invocation: ToolInvocation) -> ToolOutput:
    """The text of a workspace file (UTF-8; undecodable bytes replaced), its first 1 MiB at most."""
    path = invocation.arguments["path"]
    with open_regular(invocation.workspace, path) as fd:
        size = os.fstat(fd).st_size
        data = _read(fd, READ_CAP)
    text = data.decode("utf-8", "replace")
    if size > len(data):
        text += f"\n[read_file: showed the first {len(data)} of {size} bytes]"
    return ToolOutput(text)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "symlink" if stat.S_ISLNK(mode) else "other"


def list_dir(invocation: ToolInvocation) -> ToolOutput:
    """The entries of a workspace directory, sorted, one per line: "<kind> <size> <name>" (at most 500)."""
    path = invocation.arguments.get("path", ".")
    with workspace_dir(invocation.workspace, path) as fd:
        names = sorted(os.listdir(fd))
        lines = []
        for name in names[:LIST_CAP]:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            lines.append(f"{_kind(info.st_mode)} {info.st_size} {name}")
    if len(names) > LIST_CAP:
        lines.append(f"[list_dir: showed {LIST_CAP} of {len(names)} entries]")
    return ToolOutput("\n".join(lines) if lines else "(empty directory)")


def search_text(invocation: ToolInvocation) -> ToolOutput:
    """Lines containing `text` (literal, case-sensitive) in regular files under `path`, as "file:line: text";
    symlinks are not followed and VCS/cache directories are skipped; bounded in files, bytes and matches."""
    needle = invocation.arguments["text"]
    base = "/".join(parts_of(invocation.arguments.get("path", ".")))
    if not needle:
        raise WorkspacePathError("search_text needs a non-empty text")
    matches: list[str] = []
    seen = 0
    with workspace_dir(invocation.workspace, base) as top:
        for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if seen >= SEARCH_FILES or len(matches) >= SEARCH_MATCHES:
                    break
                seen += 1
                rel = os.path.normpath(os.path.join(base or ".", dirpath, name))
                matches += _search_file(dir_fd, name, rel, needle, SEARCH_MATCHES - len(matches))
    if not matches:
        return ToolOutput(f"no line contains {needle!r} ({seen} files searched)")
    if len(matches) >= SEARCH_MATCHES or seen >= SEARCH_FILES:
        matches.append(f"[search_text: stopped after {len(matches)} matches in {seen} files]")
    return ToolOutput("\n".join(matches))


def _search_file(dir_fd: int, name: str, rel: str, needle: str, room: int) -> list[str]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return []  # a symlink, unreadable or vanished: not searched
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = _read(fd, SEARCH_FILE_BYTES)
    finally:
        os.close(fd)
    if b"\0" in data[:8192]:
        return []  # binary
    found = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if needle in line:
            found.append(f"{rel}:{number}: {line[:300]}")
            if len(found) >= room:
                break
    return found


def write_file(invocation: ToolInvocation) -> ToolOutput:
    """Write `content` to a workspace file atomically (`replace_file`)."""
    path, content = invocation.arguments["path"], invocation.arguments["content"]
    data = content.encode("utf-8")
    replace_file(invocation.workspace, path, data, invocation.call_id)
    return ToolOutput(f"wrote {len(data)} bytes to {path}")


def replace_file(workspace, path: str, data: bytes, call_id: str) -> None:
    """Write `data` to workspace file `path` atomically (a temporary file in the same directory named after
    `call_id`, fsynced, renamed over the target). The parent directory must exist; an existing target must be a
    regular file (a symlink is refused, and one swapped in after that check is replaced by the rename, never
    followed)."""
    parent, name = split(path)
    with workspace_dir(workspace, parent) as dir_fd:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            raise WorkspacePathError(f"path {path!r} exists and is a {_kind(mode)}, not a regular file")
        temp = f".{name[:200]}.{call_id[:32]}.emelex-tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
        os.fsync(dir_fd)
