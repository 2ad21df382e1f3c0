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
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n"
    "\n"
    "Written by the benchmarks (`make bench`, or one `python benchmarks/bench_NAME.py`): each has a section here,\n"
    "dated, with its target, and replaces it when it runs again; README and docs link here and copy no figure.\n"
    "Each benchmark measures against a raw baseline in the same run, alternating the two sides so the machine's\n"
    "load hits both alike. The machine: a 2-core VM shared with other work, where `fsync` usually costs only\n"
    "about 0.1 ms, so Python overhead weighs far more than it would where a commit costs a millisecond.\n"
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


class Figures:
    """One benchmark's section: `add` prints a figure line (stating its target) and keeps it; `write` puts the
    section `name` into RESULTS.md: `## title`, the date, the figure lines as a list, then `about` (what is
    measured and why the figures are what they are)."""

    def __init__(self, name: str, title: str, about: str = "") -> None:
        """A section `name` headed `title`, with the closing text `about`."""
        self.name, self.title, self.about, self.lines = name, title, about.strip(), []

    def add(self, line: str) -> None:
        """Print `line` and keep it for the section."""
        print(line)
        self.lines.append(line)

    def write(self, path: Path = RESULTS) -> None:
        """Write the section (replacing the previous one of its name)."""
        figures = "\n".join(f"- {line}" for line in self.lines)
        body = f"## {self.title}\n\nMeasured {date.today().isoformat()}:\n\n{figures}\n"
        write_section(self.name, body + (f"\n{self.about}\n" if self.about else ""), path)
