"""benchmarks/RESULTS.md, the one results file every benchmark writes its figures to, one section each.

A section is delimited by `<!-- section: NAME -->` and `<!-- end: NAME -->` lines. Its first line inside is
`<!-- figures: {...} -->`: the figures the run measured, as JSON; the rest is what the script's `render` makes
of them, so tests/test_bench_results.py can check that each section is exactly its script's rendering of its
recorded figures (no figure typed or kept by hand). A benchmark script names its sections in `SECTIONS` and
defines `render(figures) -> str` (Markdown); `publish` writes a section from the figures. Writing a section
replaces the previous one of that name in place (or appends it when there is none), leaving every other
section as it was; the file is replaced atomically, so a crash leaves the old file or the new one.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n"
    "\n"
    "Written by the benchmarks (`make bench`, or one `python benchmarks/bench_NAME.py`): each has a section here,\n"
    "dated, with its target, and replaces it when it runs again; README and docs link here and copy no figure.\n"
    "Each benchmark measures against a raw baseline in the same run, alternating the two sides so the machine's\n"
    "load hits both alike, prints each figure beside its target and exits 1 when it misses one. Each section\n"
    "starts with the figures its run recorded (a JSON comment); the text is the script's rendering of them.\n"
    "The machine: a 2-core VM shared with other work, so a single run's figures are noisy.\n"
)
FIGURES_LINE = re.compile(r"<!-- figures: (.*) -->\n")
SECTION = re.compile(r"<!-- section: ([a-z0-9-]+) -->\n(.*?)<!-- end: \1 -->", re.DOTALL)
TARGETS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda value, bound: value <= bound,
    "<": lambda value, bound: value < bound,
    ">=": lambda value, bound: value >= bound,
}


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


def publish(name: str, render: Callable[[dict], str], figures: dict, path: Path = RESULTS) -> str:
    """Write the section `name`: the JSON of `figures` (the date added as "measured"), then `render` of them;
    return that rendering."""
    figures = {"measured": date.today().isoformat(), **figures}
    line = json.dumps(figures, sort_keys=True, ensure_ascii=False)
    if "-->" in line:
        raise ValueError("figures must not contain '-->', which would end their comment")
    text = render(figures)
    write_section(name, f"<!-- figures: {line} -->\n{text.strip()}\n", path)
    return text


def recorded(path: Path = RESULTS) -> dict[str, tuple[dict | None, str]]:
    """Each section of `path` -> (its recorded figures, or None when it has none; the text after them)."""
    found = {}
    for match in SECTION.finditer(path.read_text(encoding="utf-8")):
        body = match.group(2)
        head = FIGURES_LINE.match(body)
        found[match.group(1)] = (json.loads(head.group(1)), body[head.end():]) if head else (None, body)
    return found


def met(value: float, op: str, bound: float) -> bool:
    """Whether `value` meets the target `op bound` (`op` one of <=, <, >=)."""
    return TARGETS[op](value, bound)


def verdict(value: float, op: str, bound: float) -> str:
    """"target OP BOUND: met" or "... **not met**", to print beside a figure."""
    return f"target {op} {bound:g}: {'met' if met(value, op, bound) else '**not met**'}"


def figure_line(figure: dict) -> str:
    """One figure of `Figures`: "what: value (target OP BOUND: met; detail)"."""
    if "skipped" in figure:
        return f"{figure['what']}: skipped ({figure['skipped']})"
    value = format(figure["value"], figure.get("format", ".3f")) + figure.get("unit", "")
    detail = f"; {figure['detail']}" if figure.get("detail") else ""
    return f"{figure['what']}: {value} ({verdict(figure['value'], figure['op'], figure['target'])}{detail})"


def render_list(title: str, about: str, figures: dict) -> str:
    """The section of a `Figures` benchmark: `## title`, the date, one list item per figure, then `about`."""
    lines = "\n".join(f"- {figure_line(f)}" for f in figures["figures"])
    return f"## {title}\n\nMeasured {figures['measured']}:\n\n{lines}\n\n{about.strip()}\n"


class Figures:
    """One run's figures for the section `name`, rendered by `render`: `add` prints a figure beside its target
    and keeps it; `write` publishes the section and returns the exit status (1 when a target was missed)."""

    def __init__(self, name: str, render: Callable[[dict], str]) -> None:
        """The figures of section `name`, written with `render` (usually `render_list` with the script's text)."""
        self.name, self.render, self.figures = name, render, []

    def add(self, what: str, value: float, op: str, target: float, *, unit: str = "", format: str = ".3f",
            detail: str = "") -> None:
        """Record `what` measured as `value` against the target `op target`; print it."""
        figure = {"what": what, "value": value, "op": op, "target": target, "unit": unit, "format": format,
                  "detail": detail}
        print(figure_line(figure))
        self.figures.append(figure)

    def skip(self, what: str, reason: str) -> None:
        """Record that `what` was not measured, and why (no target is missed)."""
        figure = {"what": what, "skipped": reason}
        print(figure_line(figure))
        self.figures.append(figure)

    def missed(self) -> list[str]:
        """The figures that missed their target."""
        return [f["what"] for f in self.figures if "skipped" not in f and not met(f["value"], f["op"], f["target"])]

    def write(self, path: Path = RESULTS) -> int:
        """Publish the section; 1 when a target was missed (saying which), else 0."""
        publish(self.name, self.render, {"figures": self.figures}, path)
        missed = self.missed()
        if missed:
            print(f"missed the target: {'; '.join(missed)}")
        return 1 if missed else 0


def render_pending(figures: dict) -> str:
    """The section of a benchmark not run since its rendering changed: what to run to measure it."""
    return (f"## {figures['title']}\n\nNot measured since {figures['measured']}, when the section's form changed "
            f"({figures['reason']}): run `python benchmarks/{figures['script']}` to measure it.\n")


def mark_pending(name: str, title: str, script: str, reason: str, path: Path = RESULTS) -> None:
    """Replace the section `name` by a note that `script` has to run again (`render_pending`), figures none."""
    publish(name, render_pending, {"pending": True, "title": title, "script": script, "reason": reason}, path)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Mark a section of RESULTS.md as waiting for its benchmark's run.")
    parser.add_argument("section")
    parser.add_argument("title")
    parser.add_argument("script")
    parser.add_argument("reason")
    args = parser.parse_args()
    mark_pending(args.section, args.title, args.script, args.reason)
