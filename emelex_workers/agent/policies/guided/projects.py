"""A project's own test commands, found from its files, for a request to run "the tests": what its manifest or build
file declares (an npm `test` script, a Makefile `test` target, pytest configuration, a Cargo or Go module), else a
test directory of Python test modules. Read confined to the workspace, a few small files at the top only."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Collection
from pathlib import Path

MANIFEST_BYTES = 65536  # of one file read at most
_MAKE_TEST = re.compile(r"^test\s*:", re.M)


def _top_text(workspace: Path, name: str) -> str | None:
    """The text of regular file `name` at the top of `workspace` (no symlink followed), or None."""
    try:
        fd = os.open(os.path.join(workspace, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MANIFEST_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def project_tests(workspace: Path | None, files: Collection[str]) -> list[str]:
    """The test commands the project in `workspace` (whose listed files are `files`, workspace-relative) declares,
    most specific first: "npm test" (package.json has a test script), "make test" (a Makefile has a test target),
    "python3 -m pytest" (pytest is configured: pytest.ini, a conftest.py, or a pytest section in pyproject.toml,
    setup.cfg or tox.ini), "cargo test", "go test ./..."; else, for a directory of `test_*.py` modules, "python3 -m
    unittest discover -s DIR"; empty when there is none (or no workspace)."""
    if workspace is None:
        return []
    found: list[str] = []
    package = _top_text(workspace, "package.json")
    if package is not None:
        try:
            if isinstance(json.loads(package).get("scripts", {}).get("test"), str):
                found.append("npm test")
        except (ValueError, AttributeError):
            pass
    if any(_MAKE_TEST.search(_top_text(workspace, name) or "") for name in ("Makefile", "makefile", "GNUmakefile")):
        found.append("make test")
    configured = "pytest.ini" in files or "conftest.py" in files or any(
        "pytest" in (_top_text(workspace, name) or "") for name in ("pyproject.toml", "setup.cfg", "tox.ini"))
    if configured:
        found.append("python3 -m pytest")
    if "Cargo.toml" in files:
        found.append("cargo test")
    if "go.mod" in files:
        found.append("go test ./...")
    if not found:
        dirs = sorted({path.rsplit("/", 1)[0] for path in files
                       if "/" in path and path.rsplit("/", 1)[1].startswith("test_") and path.endswith(".py")})
        found += [f"python3 -m unittest discover -s {d}" for d in dirs[:2]]
    return found
