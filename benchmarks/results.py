"""benchmarks/RESULTS.md, the one results file every benchmark writes its figures to, one section each.

A section is delimited by `<!-- section: NAME -->` and `<!-- end: NAME -->`
lines. Writing a section replaces the previous one of that name in place (or
appends it when there is none), leaving every other section as it was; the
file is replaced atomically, so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n\n"
    "Written by the benchmarks (`make bench`); each section is replaced when its benchmark runs again.\n"
)


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Put `body` (Markdown) into the section `name` of `path`, replacing that section if it exists."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ValueError(f"a section name is lowercase letters, digits and '-', not {name!r}")
    start, end = f"<!-- section: {name} -->", f"<!-- end: {name} -->"
    block = f"{start}\n{body.strip()}\n{end}\n"
    text = path.read_text(encoding="utf-8") if path.exists() else HEADER
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".RESULTS-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
