"""How faithful the worker's output is: the real pipeline on the default model over conversations with known facts.

Every conversation of `quality/heldout.json` (hand-written, held out: the
pipeline is never tuned on them; `--dev` runs `quality/dev.json`, the set it
may be tuned on) becomes a Session in its own workspace of a real store in a
temporary Emelex Home, with the default model installed. A compaction of the
whole conversation is queued (planned with the model's tokenizer, as
`emelex memory compact --force` does, keeping no turn), the Session's clean
exit queues its distillation, and `emelex_workers.worker.work.Worker` runs every
job, retries included (the store's clock is moved past each retry deadline
instead of waiting for it). Then, per conversation:

- Knowledge: each entry is *supported* when `faithfulness.supported` holds
  against the conversation's event texts (quoted, or every content word in
  one source sentence of the same polarity) and *verbatim* when it is
  quoted; a known fact is *recovered* when all its terms occur (ignoring
  case, at word boundaries) in one entry; an entry is *precise* when it
  recovers some known fact; a rejected proposal is *stored as true* when all
  its terms occur in an entry that contains no negation; a *worked-example
  copy* matches a worked example the summarizer or distiller declares
  (`faithfulness.matches_example`); a *vacuous* entry has fewer than two
  content words.
- Summary: *key-name coverage* is the share of the conversation's key names
  (identifiers, file names, numbers; listed in the data) that occur in it;
  it *loops* when a sentence repeats an earlier one or repeats itself
  (`faithfulness.looping`); *compression* is its words over the source's.
- Keys: a key is *good* when it has two or more hyphen-separated words, not
  all numbers, each a word of the entry's content (`key_quality`).
- Guard-independent checks, plain string tests that use no `faithfulness`
  function: an entry or a Summary sentence (speaker label aside) *occurs in
  the source* when its casefolded, space-collapsed text, final full stop
  aside, is a substring of one source text; numbers (`\d+(.\d+)*`) an entry
  or a Summary names that no source text contains are counted.

Then (not with `--no-shared`) the *shared-workspace* run: the same
conversations as Sessions of one workspace, each distilled by its own job
against the Knowledge the earlier jobs saved. It reports the entries, the
*overwrites* (Knowledge versions that replaced a key's content with a
different statement; target 0), key quality and the facts recovered.

Prints a table and writes the "quality" section of benchmarks/RESULTS.md
(not with `--dev` or `--no-write`). `--set KEY=VALUE` overrides a setting
(e.g. `--set distill_mode=abstractive`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emelex_memory import CompactionPolicy, DefaultModelUnavailableError, MemoryStore, NewEvent, Settings
from emelex_workers import faithfulness as fx
from emelex_workers.models import ModelManager, default_model_file
from emelex_workers.worker.planning import default_model_budget
from emelex_workers.host.manager import choose, distillers, get_plugin_manager, summarizers
from emelex_workers.worker.work import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import write_section  # noqa: E402

DATA = Path(__file__).with_name("quality")
TARGETS = {"unsupported": 0, "example_copies": 0, "loops": 0, "recall": 0.5, "coverage": 0.6}


def has_term(term: str, text: str) -> bool:
    """True when `term` occurs in `text`, ignoring case, not inside a longer word or number."""
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(term) + r"(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


@dataclass
class Outcome:
    """What the pipeline made of one conversation."""

    conv: dict[str, Any]
    summary: str | None = None
    entries: list[tuple[str, str, float]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)


def _sources(conv: dict[str, Any]) -> list[str]:
    return [text for turn in conv["turns"] for text in turn]


def _seed(store: MemoryStore, root: Path, conv: dict[str, Any], budget, shared: bool) -> tuple[str, Path]:
    workspace = root / "workspaces" / ("shared" if shared else conv["id"])
    workspace.mkdir(parents=True, exist_ok=True)
    session = store.create_session(workspace, title=conv["id"])
    lease = store.acquire_lease(session.id, workspace)
    list(lease.replay_all())
    for user, assistant in conv["turns"]:
        lease.append_turn([NewEvent("user", {"text": user}), NewEvent("assistant", {"text": assistant})])
    queued = store.queue_compaction(session.id, context_window=budget.context_window, count_tokens=budget.count_tokens,
                                    policy=CompactionPolicy(preserve_turns=0), force=True)
    assert queued.job is not None, queued.reason
    store.finish_session(lease)
    return session.id, workspace


def run_pipeline(convs: list[dict[str, Any]], overrides: dict[str, str], *, shared: bool = False
                 ) -> tuple[list[Outcome], dict[str, Any]]:
    """Run compaction and distillation of every conversation through the worker, each in its own workspace or all
    in one (`shared`); return outcomes and run facts (with `shared`, the workspace's overwrites)."""
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    with tempfile.TemporaryDirectory(prefix="emelex-bench-quality-") as tmp:
        root = Path(tmp)
        settings = Settings(home=root / "home", plugins_autoload=False, **overrides)
        model = ModelManager(settings).install_default(link=True)
        with default_model_budget(settings) as budget:
            window = budget.context_window
            with MemoryStore.open(settings, clock=clock) as store:
                seeded = [(conv, *_seed(store, root, conv, budget, shared)) for conv in convs]
        pm = get_plugin_manager(settings)
        examples = (choose(summarizers(pm), settings.summarizer, "summarizer").component,
                    choose(distillers(pm), settings.distiller, "distiller").component)
        started = time.perf_counter()
        with MemoryStore.open(settings, clock=clock) as store:
            worker = Worker(store, settings)
            try:
                while True:
                    worker.run()
                    pending = [j for k in ("compaction", "distill")
                               for j in store.list_jobs(state="pending", kind=k, limit=1000).jobs]
                    if not pending:
                        break
                    offset[0] += max(j.due_at for j in pending) - clock() + 1
            finally:
                worker.close()
            seconds = time.perf_counter() - started
            outcomes = []
            for conv, session_id, workspace in seeded:
                out = Outcome(conv)
                first = store.replay(session_id, limit=1).events[0]
                out.summary = first.payload["text"] if first.kind == "summary" else None
                out.entries = [(e.key, e.content, e.confidence) for e in store.recall(workspace, limit=1000).entries]
                for job in store.list_jobs(session_id=session_id, limit=100).jobs:
                    out.jobs.append({"kind": job.kind, "state": job.state, "attempts": job.attempts,
                                     "result": job.result, "diagnostics": [d.message for d in job.diagnostics]})
                outcomes.append(out)
            overwrites = _overwrites(store, {w for _c, _s, w in seeded})
    run = {"model": model.name, "model_file": model.model_file.name, "reference": model.reference,
           "context_window": window, "seconds": seconds, "examples": _examples(examples), "overwrites": overwrites}
    return outcomes, run


def _overwrites(store: MemoryStore, workspaces: set[Path]) -> int:
    """How many Knowledge versions replaced a live version of their key with different content."""
    count = 0
    for workspace in workspaces:
        for entry in store.recall(workspace, limit=1000, include_tombstones=True).entries:
            page = store.knowledge_history(workspace, entry.key, limit=1000)
            contents = [v.content for v in page.versions]
            count += sum(1 for a, b in zip(contents, contents[1:]) if a is not None and b is not None and a != b)
    return count


def key_quality(key: str, content: str) -> bool:
    """True when `key` is a good key for `content`: at least two hyphen-separated words, not all numbers, every
    one a word of `content` (ignoring case): it names the statement by its own words, more than one of them."""
    parts = key.split("-")
    said = set(re.findall(r"[a-z0-9]+", content.lower()))
    return len(parts) >= 2 and not all(p.isdigit() for p in parts) and set(parts) <= said


def _plain(text: str) -> str:
    """`text` casefolded with runs of white space made one space: for checks that use no guard function."""
    return " ".join(text.casefold().split())


def in_source(text: str, sources: list[str]) -> bool:
    """True when `text` (ignoring case, spacing and a final full stop) occurs in one source text: a plain
    substring test, independent of the guards' `faithfulness` functions."""
    needle = _plain(text).rstrip(".")
    return bool(needle) and any(needle in _plain(source) for source in sources)


def unsaid_numbers(text: str, sources: list[str]) -> list[str]:
    """The numbers in `text` that no source text contains (plain regex, independent of the guards)."""
    said = {n for source in sources for n in re.findall(r"\d+(?:\.\d+)*", source)}
    return [n for n in re.findall(r"\d+(?:\.\d+)*", text) if n not in said]


def _summary_sentences(summary: str) -> list[str]:
    """The sentences of a Summary's lines, each without its speaker label (plain regex)."""
    out = []
    for line in summary.splitlines():
        line = re.sub(r"^(?:user|assistant|summary|system|tool): ", "", line)
        out += [p for p in re.split(r"(?<=[.!?])\s+", line) if p.strip()]
    return out


def _examples(components) -> tuple[str, ...]:
    """The worked examples the summarizer and the distiller declare."""
    return tuple(text for c in components for text in c.examples)


def score(out: Outcome, examples: tuple[str, ...]) -> dict[str, Any]:
    """The figures of one conversation (see the module docstring for the definitions)."""
    sources, conv = _sources(out.conv), out.conv
    contents = [content for _key, content, _conf in out.entries]
    recovered = [f for f in conv["facts"] if any(all(has_term(t, c) for t in f["terms"]) for c in contents)]
    precise = [c for c in contents if any(all(has_term(t, c) for t in f["terms"]) for f in conv["facts"])]
    as_true = [c for c in contents for r in conv["rejected"]
               if all(has_term(t, c) for t in r["terms"]) and not fx.negated(c)]
    summary = out.summary or ""
    parts = fx.sentences(summary)
    norms = [fx.normalize(s) for s in parts]
    loops = bool(parts) and (len(set(norms)) < len(norms) or any(fx.looping(s) for s in parts))
    names = conv["key_names"]
    return {
        "id": conv["id"], "entries": len(contents), "facts": len(conv["facts"]), "recovered": len(recovered),
        "supported": sum(fx.supported(c, sources) for c in contents),
        "verbatim": sum(fx.quoted(c, sources) for c in contents),
        "precise": len(precise), "rejected_as_true": len(as_true),
        "example_copies": sum(fx.matches_example(c, examples, sources) for c in contents),
        "vacuous": sum(fx.vacuous(c) for c in contents),
        "confidences": [conf for _k, _c, conf in out.entries],
        "summary": out.summary, "summary_ok": out.summary is not None,
        "coverage": sum(has_term(n, summary) for n in names) / len(names),
        "loops": loops, "summary_example": any(fx.matches_example(s, examples, sources) for s in parts),
        "unterminated": bool(parts) and not fx.terminated(parts[-1]),
        "compression": len(fx.words(summary)) / max(1, len(fx.words(" ".join(sources)))),
        "jobs": out.jobs,
        "good_keys": sum(key_quality(k, c) for k, c, _conf in out.entries),
        "plain_quoted": sum(in_source(c, sources) for c in contents),
        "unsaid_numbers": sum(bool(unsaid_numbers(c, sources)) for c in contents),
        "summary_sentences": len(_summary_sentences(summary)),
        "summary_unquoted": sum(not in_source(p, sources) for p in _summary_sentences(summary)),
        "summary_unsaid_numbers": len(unsaid_numbers(summary, sources)),
    }


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures over all conversations."""
    entries = sum(r["entries"] for r in rows)
    confs = [c for r in rows for c in r["confidences"]]
    summarized = [r for r in rows if r["summary_ok"]]
    jobs = [j for r in rows for j in r["jobs"]]
    return {
        "conversations": len(rows), "entries": entries, "facts": sum(r["facts"] for r in rows),
        "recovered": sum(r["recovered"] for r in rows),
        "recall": sum(r["recovered"] for r in rows) / max(1, sum(r["facts"] for r in rows)),
        "supported": sum(r["supported"] for r in rows), "unsupported": entries - sum(r["supported"] for r in rows),
        "verbatim": sum(r["verbatim"] for r in rows), "precise": sum(r["precise"] for r in rows),
        "rejected_as_true": sum(r["rejected_as_true"] for r in rows),
        "rejected_total": sum(len(r["conv"]["rejected"]) for r in rows) if rows and "conv" in rows[0] else None,
        "example_copies": sum(r["example_copies"] for r in rows), "vacuous": sum(r["vacuous"] for r in rows),
        "distinct_confidences": len({round(c, 3) for c in confs}),
        "confidence_range": (min(confs), max(confs)) if confs else None,
        "summaries": len(summarized),
        "coverage": sum(r["coverage"] for r in summarized) / max(1, len(rows)),
        "loops": sum(r["loops"] for r in rows), "summary_examples": sum(r["summary_example"] for r in rows),
        "unterminated": sum(r["unterminated"] for r in rows),
        "compression": sum(r["compression"] for r in summarized) / max(1, len(summarized)),
        "jobs": Counter(f"{j['kind']}:{j['state']}" for j in jobs),
        **{k: sum(r[k] for r in rows) for k in ("good_keys", "plain_quoted", "unsaid_numbers", "summary_sentences",
                                                "summary_unquoted", "summary_unsaid_numbers")},
        "retries": sum(j["attempts"] for j in jobs),
    }


def _met(name: str, value: float) -> str:
    target = TARGETS[name]
    ok = value <= target if isinstance(target, int) else value >= target
    return "met" if ok else "**not met**"


def report(rows: list[dict[str, Any]], t: dict[str, Any], run: dict[str, Any], settings_note: str, data: str,
           title: str, command: str) -> str:
    """The Markdown section for RESULTS.md."""
    day = datetime.date.today().isoformat()
    rng = t["confidence_range"]
    conf = f"{t['distinct_confidences']} distinct values" + (f", {rng[0]:.2f}-{rng[1]:.2f}" if rng else "")
    jobs = ", ".join(f"{n} {k}" for k, n in sorted(t["jobs"].items()))
    lines = [
        f"## {title} (`bench_quality.py`), {day}",
        "",
        f"Model: `{run['model']}` (`{run['model_file']}`), context window {run['context_window']} tokens; "
        f"settings: {settings_note}. {t['conversations']} conversations of `benchmarks/quality/{data}`, "
        f"{t['facts']} known facts; jobs: {jobs}, {t['retries']} failed attempts retried; "
        f"{run['seconds']:.0f} s of worker time on a shared 2-core machine. Produced by `{command}`.",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        f"| Knowledge entries saved | {t['entries']} | |",
        f"| entries not supported by the source | {t['unsupported']} of {t['entries']} | "
        f"0 ({_met('unsupported', t['unsupported'])}) |",
        f"| entries quoted verbatim from the source | {t['verbatim']} of {t['entries']} | |",
        f"| known facts recovered (recall) | {t['recovered']} of {t['facts']} ({t['recall']:.2f}) | "
        f">= 0.5 ({_met('recall', t['recall'])}) |",
        f"| entries that state a known fact (precision) | {t['precise']} of {t['entries']} | |",
        f"| entries saved per known fact | {t['entries'] / max(1, t['facts']):.2f} | |",
        f"| rejected proposals stored as true | {t['rejected_as_true']} | |",
        f"| worked-example copies | {t['example_copies']} | 0 ({_met('example_copies', t['example_copies'])}) |",
        f"| vacuous entries (fewer than two content words) | {t['vacuous']} | |",
        f"| confidence | {conf} | measured, not constant |",
        f"| Summaries written | {t['summaries']} of {t['conversations']} | |",
        f"| Summary key-name coverage (mean; a missing Summary counts 0) | {t['coverage']:.2f} | "
        f">= 0.6 ({_met('coverage', t['coverage'])}) |",
        f"| Summaries with a repetition loop | {t['loops']} | 0 ({_met('loops', t['loops'])}) |",
        f"| Summaries echoing a worked example | {t['summary_examples']} | |",
        f"| Summaries ending mid-sentence | {t['unterminated']} | |",
        f"| Summary length, words, over the source's (mean) | {t['compression']:.2f} | |",
        f"| Knowledge keys of two or more of the entry's own words | {t['good_keys']} of {t['entries']} | |",
        "",
        "Guard-independent checks (plain string tests that use none of `faithfulness.py`, so a flaw in the guards' "
        "own support test cannot hide here):",
        "",
        "| check | value |",
        "| --- | --- |",
        f"| entries whose text occurs in the source (ignoring case, spacing, a final full stop) | "
        f"{t['plain_quoted']} of {t['entries']} |",
        f"| entries naming a number the source does not | {t['unsaid_numbers']} |",
        f"| Summary sentences (speaker labels aside) not found in the source | {t['summary_unquoted']} of "
        f"{t['summary_sentences']} |",
        f"| numbers in Summaries the source does not contain | {t['summary_unsaid_numbers']} |",
        "",
        "| conversation | entries | recovered | supported | rejected as true | key-name coverage | loops |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['id']} | {r['entries']} | {r['recovered']} of {r['facts']} | {r['supported']} | "
                     f"{r['rejected_as_true']} | {r['coverage']:.2f} | {'yes' if r['loops'] else 'no'} |")
    return "\n".join(lines)


def shared_scores(outcomes: list[Outcome], run: dict[str, Any]) -> dict[str, Any]:
    """The figures of the shared-workspace run: every Session distilled into one workspace."""
    entries = outcomes[0].entries if outcomes else []
    contents = [c for _k, c, _conf in entries]
    sources = [text for o in outcomes for text in _sources(o.conv)]
    facts = [f for o in outcomes for f in o.conv["facts"]]
    return {"sessions": len(outcomes), "entries": len(entries), "overwrites": run["overwrites"],
            "good_keys": sum(key_quality(k, c) for k, c, _conf in entries),
            "recovered": sum(any(all(has_term(t, c) for t in f["terms"]) for c in contents) for f in facts),
            "facts": len(facts), "plain_quoted": sum(in_source(c, sources) for c in contents),
            "seconds": run["seconds"]}


def shared_report(sh: dict[str, Any], separate_entries: int) -> list[str]:
    """The shared-workspace lines of the section."""
    met = "met" if sh["overwrites"] == 0 else "**not met**"
    return [
        "",
        f"Shared workspace: the same {sh['sessions']} conversations as Sessions of *one* workspace, each distilled "
        f"by its own job against the Knowledge the earlier jobs saved ({sh['seconds']:.0f} s of worker time).",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        f"| Knowledge entries in the workspace | {sh['entries']} (separate workspaces: {separate_entries}) | |",
        f"| versions that replaced an entry's content with a different statement (overwrites) | "
        f"{sh['overwrites']} | 0 ({met}) |",
        f"| keys of two or more of the entry's own words | {sh['good_keys']} of {sh['entries']} | |",
        f"| known facts recovered | {sh['recovered']} of {sh['facts']} | |",
        f"| entries whose text occurs in the source (guard-independent) | {sh['plain_quoted']} of {sh['entries']} | |",
    ]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="store_true", help="run the development set (never written to RESULTS.md)")
    parser.add_argument("--only", action="append", default=[], help="run only this conversation ID (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--no-shared", action="store_true", help="skip the shared-workspace run")
    parser.add_argument("--dump", type=Path, help="write every conversation's outputs and figures as JSON here")
    parser.add_argument("--section", default="quality", help="RESULTS.md section to write (default: quality)")
    parser.add_argument("--title", default="Quality", help="the section's heading (default: Quality)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("llama_cpp") is None:
        print("quality: skipped (llama-cpp-python is not installed)")
        return
    try:
        default_model_file()
    except DefaultModelUnavailableError as exc:
        print(f"quality: skipped ({exc})")
        return
    # One thread: on this shared 2-core machine two llama.cpp threads contending with other work generate ~10x
    # slower; the thread count does not change what greedy decoding chooses.
    overrides = {"model_threads": "1", **dict(item.split("=", 1) for item in args.set)}
    data_file = "dev.json" if args.dev else "heldout.json"
    data = json.loads((DATA / data_file).read_text(encoding="utf-8"))
    convs = [c for c in data["conversations"] if not args.only or c["id"] in args.only]
    outcomes, run = run_pipeline(convs, overrides)
    rows = [dict(score(o, run["examples"]), conv=o.conv) for o in outcomes]
    t = totals(rows)
    for r in rows:
        print(f"\n== {r['id']}: {r['recovered']}/{r['facts']} facts, {r['entries']} entries "
              f"({r['supported']} supported), coverage {r['coverage']:.2f}, loops {r['loops']}")
        print(f"   summary: {r['summary']!r}")
        for key, content, conf in outcomes[rows.index(r)].entries:
            print(f"   [{conf:.2f}] {key}: {content}")
        for job in r["jobs"]:
            print(f"   job {job['kind']} {job['state']} attempts={job['attempts']} result={job['result']} "
                  f"diagnostics={job['diagnostics']}")
    printable = {k: v for k, v in t.items() if k != "jobs"}
    print("\n" + json.dumps(printable, default=str))
    note = ", ".join(f"`{k}={v}`" for k, v in overrides.items()) or "defaults"
    command = " ".join(["python", "benchmarks/bench_quality.py", *(shlex.quote(a) for a in argv)])
    section = report(rows, t, run, note, data_file, args.title, command)
    if not args.no_shared:
        shared, shared_run = run_pipeline(convs, overrides, shared=True)
        section += "\n" + "\n".join(shared_report(shared_scores(shared, shared_run), t["entries"]))
    print("\n" + section)
    if args.dump:
        args.dump.write_text(json.dumps({"run": run, "rows": [{k: v for k, v in r.items() if k != "conv"}
                                                              for r in rows]}, indent=1, default=str))
    if not (args.dev or args.no_write or args.only):
        write_section(args.section, section)


if __name__ == "__main__":
    main(sys.argv[1:])
