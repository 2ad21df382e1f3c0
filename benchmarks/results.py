"""benchmarks/RESULTS.md, the one results file every benchmark writes its figures to, one section each.

A section is delimited by `<!-- section: NAME -->` and `<!-- end: NAME -->` lines. Its first line inside is
`<!-- figures: {...} -->`: the figures the run measured, as JSON; the rest is what the script's `render` makes
of them, then the run's line (`run_line`), so tests/test_bench_results.py can check that each section is exactly
its script's rendering of its recorded figures (no figure typed or kept by hand). A benchmark script names its
sections in `SECTIONS`, the code it measures in `MEASURES` (paths from the repository's root) and defines
`render(figures) -> str` (Markdown); `publish` writes a section from the figures, recording the run: the commit
the code was at (and whether it had uncommitted changes) and the machine's load. Writing a section replaces the
previous one of that name in place (or appends it when there is none), leaving every other section as it was;
the file is replaced atomically, so a crash leaves the old file or the new one.

`python benchmarks/results.py --check` (`make bench-check`) flags every section older than the code it measures:
one whose run recorded no commit, a commit this repository does not have, or a commit since which its script or a
path of its `MEASURES` changed (the working tree included); it exits 1 when it flags one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
BENCHMARKS = RESULTS.parent
HEADER = (
    "# Benchmark results\n"
    "\n"
    "Written by the benchmarks (`make bench`, or one `python benchmarks/bench_NAME.py`): each has a section here,\n"
    "dated, with its target, and replaces it when it runs again; README and docs link here and copy no figure.\n"
    "Each benchmark measures against a raw baseline in the same run, alternating the two sides so the machine's\n"
    "load hits both alike, prints each figure beside its target and exits 1 when it misses one. Each section\n"
    "starts with the figures its run recorded (a JSON comment); the text is the script's rendering of them, and\n"
    "its last line names the commit the run measured and the machine's load. `make bench-check` flags a section\n"
    "whose code changed since its run.\n"
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


def _git(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)


def run_facts(root: Path | None = None) -> dict:
    """What a run records of itself: the commit the code was at (`commit`, None outside a git checkout), whether
    tracked files other than the results file differed from it (`dirty`), and the machine's load averages over 1,
    5 and 15 minutes with its CPU count."""
    root = root or BENCHMARKS.parent
    head = _git("rev-parse", "HEAD", root=root)
    status = _git("status", "--porcelain", "--untracked-files=no", root=root)
    changed = [line[3:] for line in status.stdout.splitlines() if not line[3:].endswith("RESULTS.md")]
    return {"commit": head.stdout.strip() if head.returncode == 0 else None, "dirty": bool(changed),
            "load": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


def run_line(figures: dict) -> str:
    """The line that ends a section: the commit its run measured and the machine's load then ("" for a section
    recorded before runs were)."""
    run = figures.get("measured_at")
    if not run:
        return ""
    commit = f"commit `{run['commit'][:12]}`" if run.get("commit") else "no git commit"
    dirty = " with uncommitted changes" if run.get("dirty") else ""
    load = " / ".join(f"{x:.2f}" for x in run["load"])
    return f"Run at {commit}{dirty}; machine load {load} (1, 5, 15 min) on {run['cpus']} CPUs.\n"


def section_text(render: Callable[[dict], str], figures: dict) -> str:
    """A section's text for its recorded `figures`: the script's `render` of them, then the run's line."""
    text = render(figures).strip() + "\n"
    line = run_line(figures)
    return f"{text}\n{line}" if line else text


def publish(
    name: str, render: Callable[[dict], str], figures: dict, path: Path = RESULTS, *, run: bool = True
) -> str:
    """Write the section `name`: the JSON of `figures` (the date added as "measured" and, for a run, what it
    measured as "measured_at": see `run_facts`), then its text (`section_text`); return the script's rendering."""
    figures = {"measured": date.today().isoformat(), **({"measured_at": run_facts()} if run else {}), **figures}
    line = json.dumps(figures, sort_keys=True, ensure_ascii=False)
    if "-->" in line:
        raise ValueError("figures must not contain '-->', which would end their comment")
    write_section(name, f"<!-- figures: {line} -->\n{section_text(render, figures)}", path)
    return render(figures)


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
    """One figure of `Figures`: "what: value (target OP BOUND: met; detail)", or for a figure reported without a
    target "what: value (reported: why; detail)"."""
    if "skipped" in figure:
        return f"{figure['what']}: skipped ({figure['skipped']})"
    value = format(figure["value"], figure.get("format", ".3f")) + figure.get("unit", "")
    detail = f"; {figure['detail']}" if figure.get("detail") else ""
    if "reported" in figure:
        return f"{figure['what']}: {value} (reported: {figure['reported']}{detail})"
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

    def report(self, what: str, value: float, why: str, *, unit: str = "", format: str = ".3f",
               detail: str = "") -> None:
        """Record `what` measured as `value` with no target (a figure kept for what it shows, `why`); print it."""
        figure = {"what": what, "value": value, "reported": why, "unit": unit, "format": format, "detail": detail}
        print(figure_line(figure))
        self.figures.append(figure)

    def skip(self, what: str, reason: str) -> None:
        """Record that `what` was not measured, and why (no target is missed)."""
        figure = {"what": what, "skipped": reason}
        print(figure_line(figure))
        self.figures.append(figure)

    def missed(self) -> list[str]:
        """The figures that missed their target."""
        return [f["what"] for f in self.figures
                if "skipped" not in f and "reported" not in f and not met(f["value"], f["op"], f["target"])]

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
    publish(name, render_pending, {"pending": True, "title": title, "script": script, "reason": reason}, path,
            run=False)


def scripts(benchmarks: Path = BENCHMARKS) -> dict[str, object]:
    """Each benchmark script's module by its file name (`bench_*.py`), loaded as `make bench` runs them."""
    sys.path.insert(0, str(benchmarks))
    found = {}
    for path in sorted(benchmarks.glob("bench_*.py")):
        module = sys.modules.get(path.stem)
        if module is None:
            spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module  # a script's dataclasses look their module up
            spec.loader.exec_module(module)
        found[path.name] = module
    return found


def stale(path: Path = RESULTS, owners: dict[str, tuple[str, tuple[str, ...]]] | None = None,
          root: Path | None = None) -> dict[str, str]:
    """Each section of `path` older than the code it measures -> why. `owners` maps a section to (its script's
    path, the paths the script measures), all from the repository's `root` (default: every `bench_*.py` here, with
    its `SECTIONS` and `MEASURES`). A section is older when its run recorded no commit, recorded a commit `root`
    does not have, or when its script or a path it measures differs between that commit and the working tree."""
    root = root or BENCHMARKS.parent
    if owners is None:
        owners = {section: (f"benchmarks/{name}", tuple(module.MEASURES))
                  for name, module in scripts().items() for section in module.SECTIONS}
    flagged = {}
    for section, (figures, _) in recorded(path).items():
        script, measures = owners.get(section, (None, ()))
        commit = ((figures or {}).get("measured_at") or {}).get("commit")
        if script is None:
            flagged[section] = "no benchmark writes this section"
        elif not commit:
            flagged[section] = f"its run recorded no commit: run `python {script}` again"
        elif _git("cat-file", "-e", f"{commit}^{{commit}}", root=root).returncode != 0:
            flagged[section] = f"its commit {commit[:12]} is not in this repository: run `python {script}` again"
        else:
            changed = _git("diff", "--name-only", commit, "--", script, *measures, root=root).stdout.split()
            if changed:
                shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
                flagged[section] = f"the code it measures changed since {commit[:12]} ({shown}): run `python {script}`"
    return flagged


def check(path: Path = RESULTS) -> int:
    """Print each section older than the code it measures, and why; 1 when there is one, else 0."""
    flagged = stale(path)
    for section, why in flagged.items():
        print(f"stale: {section}: {why}")
    if not flagged:
        print("every section of benchmarks/RESULTS.md is as new as the code it measures")
    return 1 if flagged else 0


if __name__ == "__main__":
    import argparse

    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    parser = argparse.ArgumentParser(description="Mark a section of RESULTS.md as waiting for its benchmark's run "
                                                 "(or, with --check alone, flag the sections older than their code).")
    parser.add_argument("section")
    parser.add_argument("title")
    parser.add_argument("script")
    parser.add_argument("reason")
    args = parser.parse_args()
    mark_pending(args.section, args.title, args.script, args.reason)
