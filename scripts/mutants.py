"""`make mutants`: break each guarantee of docs/design.md in one line and check that a linked test fails.

The breaking changes are listed in scripts/mutants.toml, each with the guarantee it breaks (the bold title of
its bullet in docs/design.md), the file, the exact text it replaces (found exactly once) and the linked tests
that must fail. The tree is copied to a temporary directory; each change is applied there alone, the tests are
run against the copy (PYTHONPATH points at it, so nothing of the working tree is imported or changed), and the
copy is restored before the next. A change under which every test still passes "survives": the proof does not
prove. The script exits 1 when a change survives, a test run errors (collection, a bad test name), or a
guarantee has no change listed; `--only TEXT` runs the changes whose guarantee or file contains TEXT.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "scripts" / "mutants.toml"
DESIGN = ROOT / "docs" / "design.md"
GUARANTEE = re.compile(r"^- \*\*(.+?)\*\*", re.M)
LINK = re.compile(r"\[(test_\w+\.py)::(test_\w+)\]\(\.\./(tests/[\w/]*?test_\w+\.py)\)")
SKIPPED = {".git", ".venv", ".demo", "__pycache__", ".pytest_cache", ".hypothesis"}
PER_TEST_S = 240  # a mutant that makes a test hang fails it at this deadline (pytest-timeout)


@dataclass(frozen=True)
class Mutant:
    """One breaking change: in `file`, `find` (occurring exactly once) becomes `replace`; `tests` must fail."""

    guarantee: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str


def load(path: Path = LIST) -> list[Mutant]:
    """The mutants of `path`, in order."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [Mutant(m["guarantee"], m["file"], m["find"], m["replace"], tuple(m["tests"]), m.get("why", ""))
            for m in data["mutant"]]


def guarantees(design: Path = DESIGN) -> dict[str, set[str]]:
    """Each guarantee of docs/design.md (its bold title) -> the node IDs of the tests it links."""
    text = design.read_text(encoding="utf-8")
    starts = [(m.start(), m.group(1)) for m in GUARANTEE.finditer(text)]
    found = {}
    for (start, title), (end, _) in zip(starts, starts[1:] + [(len(text), "")]):
        block = text[start:end].split("\n## ", 1)[0]
        found[title] = {f"{path}::{test}" for _file, test, path in LINK.findall(block)}
    return found


def problems(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """What is wrong with the list: an unknown guarantee, a test not linked by it, a `find` text that does not
    occur exactly once, a change that changes nothing, or a guarantee of docs/design.md with no mutant."""
    linked = guarantees(root / "docs" / "design.md")
    wrong = []
    for n, m in enumerate(mutants, 1):
        where = f"mutant {n} ({m.file})"
        if m.guarantee not in linked:
            wrong.append(f"{where}: no guarantee {m.guarantee!r} in docs/design.md")
        elif not m.tests or not set(m.tests) <= linked[m.guarantee]:
            wrong.append(f"{where}: its tests must be ones {m.guarantee!r} links: {sorted(set(m.tests) - linked[m.guarantee])}")
        source = root / m.file
        count = source.read_text(encoding="utf-8").count(m.find) if source.is_file() else 0
        if count != 1:
            wrong.append(f"{where}: the text to replace occurs {count} times, not once: {m.find!r}")
        if m.find == m.replace:
            wrong.append(f"{where}: the change changes nothing")
    covered = {m.guarantee for m in mutants}
    wrong += [f"no mutant breaks the guarantee {g!r}" for g in linked if g not in covered]
    return wrong


def copy_tree(target: Path) -> Path:
    """Copy the working tree (without .git, .venv and caches) into `target`; return it."""
    shutil.copytree(ROOT, target, ignore=lambda _d, names: [n for n in names if n in SKIPPED or n.endswith(".pyc")])
    return target


def environment(copy: Path) -> dict[str, str]:
    """The test environment: the copy first on the import path, no bytecode (a same-size change within one
    second would otherwise run a stale .pyc)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(copy / "plugins")]),
            "PYTHONDONTWRITEBYTECODE": "1"}


def run_tests(copy: Path, tests: tuple[str, ...], deadline_s: int) -> tuple[int, str]:
    """Run `tests` in `copy`, stopping at the first failure; the pytest exit status and the end of its output."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--timeout={PER_TEST_S}", *tests],
        cwd=copy, env=environment(copy), capture_output=True, text=True, timeout=deadline_s)
    return done.returncode, (done.stdout + done.stderr)[-3000:]


def check_imports_from(copy: Path) -> None:
    """Fail unless the copy's packages are the ones the tests import."""
    probe = ("import emelex_memory, emelex_workers, emelex_tools, emelex_llamacpp, sys; "
             "print('\\n'.join(m.__file__ for m in (emelex_memory, emelex_workers, emelex_tools, emelex_llamacpp)))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=copy, env=environment(copy), capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    outside = [f for f in out if not Path(f).resolve().is_relative_to(copy.resolve())]
    if outside:
        raise SystemExit(f"mutants: the tests would import the working tree, not the copy: {outside}")


def main(argv: list[str] | None = None) -> int:
    """Run the listed mutants; 0 when every one is killed, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run only the mutants whose guarantee or file contains this text")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    args = parser.parse_args(argv)
    mutants = load()
    wrong = problems(mutants)
    if wrong:
        print("mutants: the list is wrong:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 1
    chosen = [m for m in mutants if not args.only or args.only in m.guarantee or args.only in m.file]
    if args.list:
        for n, m in enumerate(chosen, 1):
            print(f"{n}. {m.guarantee} | {m.file}: {m.why}")
        return 0
    failed = []
    with tempfile.TemporaryDirectory(prefix="emelex-mutants-") as tmp:
        copy = copy_tree(Path(tmp) / "tree")
        check_imports_from(copy)
        selection = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        status, output = run_tests(copy, selection, 3600)
        if status != 0:
            print(f"mutants: the linked tests fail on the unchanged tree; fix that first:\n{output}", file=sys.stderr)
            return 1
        print(f"unchanged tree: {len(selection)} linked tests pass; {len(chosen)} mutants to run")
        for n, m in enumerate(chosen, 1):
            source = copy / m.file
            original = source.read_text(encoding="utf-8")
            source.write_text(original.replace(m.find, m.replace, 1), encoding="utf-8")
            started = time.monotonic()
            try:
                status, output = run_tests(copy, m.tests, 1800)
            finally:
                source.write_text(original, encoding="utf-8")
            verdict = {0: "SURVIVED", 1: "killed"}.get(status, f"ERROR (pytest status {status})")
            print(f"{n:3}. {verdict:9} {time.monotonic() - started:6.1f} s  {m.guarantee} | {m.file}: {m.why}",
                  flush=True)
            if status != 1:
                failed.append((n, m, verdict, output))
    for n, m, verdict, output in failed:
        print(f"\nmutant {n} {verdict}: {m.guarantee}\n  {m.file}: {m.find!r} -> {m.replace!r}\n  tests: "
              f"{', '.join(m.tests)}\n{output if verdict != 'SURVIVED' else ''}", file=sys.stderr)
    print(f"{len(chosen) - len(failed)} of {len(chosen)} mutants killed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
