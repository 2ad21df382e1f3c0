r"""How faithful the worker's output is: the real pipeline on the default model over conversations with known facts.

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

- Summary, also: a *question-less answer* is a reply sentence (not itself a
  question) the Summary quotes while the question it answers (the user's last sentence, when it
  ends with "?", or its last clause) is nowhere in it.

Then (not with `--no-shared`) the *shared-workspace* run: the same
conversations as Sessions of one workspace, each distilled by its own job
against the Knowledge the earlier jobs saved. It reports the entries, the
*overwrites* (Knowledge versions that replaced a key's content with a
different statement), the share of them that are *about another subject*
(the new statement shares no identifier and no value with the old one and
does not retire its value: an overwrite that is no supersession; target 0),
key quality and the facts recovered.

Then (not with `--no-labelled`) the *labelled* run: `quality/labelled.json`,
conversations written and labelled before any run of the pipeline on them,
each statement a Knowledge entry may be made of labelled with its kind
(fact, answer with its question, superseded, proposal with its rejection,
episodic, noise). Conversations naming one workspace are Sessions of that
workspace, in order, each distilled against what the earlier ones saved; a
later one lists the earlier statements it `supersedes`. Each entry is
classified by the labelled sentence(s) it states (a "Q: ... A: ..." entry by
its answer, with its question): *standalone* (a fact; an answer with its
question; a proposal with its rejection), *fragment* (an answer without its
question, or a piece of a labelled sentence cut inside it), *superseded*
(states a value changed later, in the Session or a later one),
*proposal alone*, *episodic*, *noise*, or *unlabelled* (none of the labelled
sentences: not counted standalone). Key-fact recall counts the facts no
later Session supersedes. *Confidence separates* when the entries at or
above the median confidence are standalone more often than those below (or
both all are). Each conversation's Summary must keep its main `decision`
(all its terms). Then the same conversations with `summary_mode=abstractive`:
an *invented speaker line* is a stored Summary line labelled `user: ` or
`assistant: ` whose sentences are not all verbatim words of that speaker.

Every target is printed beside its figure; the run exits 1 when one is
missed. A section written starts with its figures as JSON (`<!-- figures:
{...} -->`) and the rest is `render` of them, a pure function: `--render`
writes the section again from the figures it records, running nothing.

Prints a table and writes the "quality" section of benchmarks/RESULTS.md
(not with `--dev`, `--only` or `--no-write`). `--set KEY=VALUE` overrides a setting
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

from emelex_memory import CompactionPolicy, DefaultModelUnavailableError, MemoryStore, NewEvent
from emelex_workers import faithfulness as fx
from emelex_workers.models import ModelManager, default_model_file
from emelex_workers.worker.planning import default_model_budget
from emelex_workers.host.manager import choose, distillers, get_plugin_manager, summarizers
from emelex_workers.worker.work import Worker
from emelex_workers.settings import WorkerSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402

DATA = Path(__file__).with_name("quality")
SECTIONS = ("quality", "quality-abstractive")  # the sections `render` makes from their recorded figures
MEASURES = (  # the code its figures measure (results.py flags a section older than it)
    "plugins/emelex_llamacpp",
    "emelex_workers/faithfulness",
    "emelex_workers/worker",
    "emelex_memory/compaction",
    "emelex_memory/knowledge",
)
# name: (comparison, target). "<=" targets are upper bounds, ">=" lower bounds, "==" exact.
TARGETS: dict[str, tuple[str, Any]] = {
    "unsupported": ("<=", 0), "example_copies": ("<=", 0), "loops": ("<=", 0), "recall": (">=", 0.5),
    "coverage": (">=", 0.6), "questionless": ("<=", 0), "foreign_overwrites": ("<=", 0),
    "standalone_share": (">=", 0.85), "superseded": ("<=", 0), "proposals_alone": ("<=", 0),
    "fragment_share": ("<=", 0.05), "noise": ("<=", 0), "labelled_recall": (">=", 0.9),
    "decisions_missed": ("<=", 0), "labelled_questionless": ("<=", 0), "confidence_separates": ("==", True),
    "invented_speaker_lines": ("<=", 0),
}


def met(name: str, value: Any) -> bool:
    """True when `value` meets the target `name` of `TARGETS`."""
    op, target = TARGETS[name]
    return value <= target if op == "<=" else value >= target if op == ">=" else value == target


def target_text(name: str, value: Any) -> str:
    """The target `name`, and whether `value` meets it: "0 (met)", ">= 0.9 (**not met**)"."""
    op, target = TARGETS[name]
    shown = ("yes" if target else "no") if isinstance(target, bool) else (f"<= {target}" if op == "<=" and target
                                                                          else f"{op} {target}" if op == ">="
                                                                          else str(target))
    return f"{shown} ({'met' if met(name, value) else '**not met**'})"


def has_term(term: str, text: str) -> bool:
    """True when `term` occurs in `text`, ignoring case, not inside a longer word or number."""
    return re.search(r"(?<![A-Za-z0-9])" + re.escape(term) + r"(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


@dataclass
class Outcome:
    """What the pipeline made of one conversation (`entries`: its workspace's Knowledge, `history`: every version
    of every key of it, oldest first)."""

    conv: dict[str, Any]
    summary: str | None = None
    entries: list[tuple[str, str, float]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    history: dict[str, list[str | None]] = field(default_factory=dict)


def _sources(conv: dict[str, Any]) -> list[str]:
    return [text for turn in conv["turns"] for text in turn]


def _workspace(root: Path, conv: dict[str, Any], shared: bool) -> Path:
    return root / "workspaces" / ("shared" if shared else conv.get("workspace", conv["id"]))


def _seed(store: MemoryStore, root: Path, conv: dict[str, Any], budget, shared: bool) -> tuple[str, Path]:
    workspace = _workspace(root, conv, shared)
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
    """Run compaction and distillation of every conversation through the worker, each in its own workspace (or the
    one its `workspace` names) or all in one (`shared`); return outcomes and run facts."""
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    with tempfile.TemporaryDirectory(prefix="emelex-bench-quality-") as tmp:
        root = Path(tmp)
        settings = WorkerSettings(home=root / "home", plugins_autoload=False, **overrides)
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
                out.history = _history(store, workspace)
                for job in store.list_jobs(session_id=session_id, limit=100).jobs:
                    out.jobs.append({"kind": job.kind, "state": job.state, "attempts": job.attempts,
                                     "result": job.result, "diagnostics": [d.message for d in job.diagnostics]})
                outcomes.append(out)
    run = {"model": model.name, "model_file": model.model_file.name, "reference": model.reference,
           "context_window": window, "seconds": seconds, "examples": _examples(examples)}
    return outcomes, run


def _history(store: MemoryStore, workspace: Path) -> dict[str, list[str | None]]:
    """Every key of the workspace with the contents of its versions, oldest first (None for a tombstone)."""
    return {entry.key: [v.content for v in store.knowledge_history(workspace, entry.key, limit=1000).versions]
            for entry in store.recall(workspace, limit=1000, include_tombstones=True).entries}


def _names(text: str) -> set[str]:
    """Identifiers and values of `text` by plain regex (independent of the plugin's rules): code spans and tokens
    with a digit, `_`, `/`, `.`, `:`, `=` or `-` between characters, casefolded."""
    spans = {m.casefold() for m in re.findall(r"`([^`]+)`", text)}
    tokens = {t.casefold().rstrip(".,;:") for t in re.findall(r"[\w./:=@%-]+", re.sub(r"`[^`]+`", " ", text))
              if re.search(r"\d|\w[_/.:=-]\w|[a-z][A-Z]", t)}
    return spans | tokens


def overwrites(history: dict[str, list[str | None]]) -> tuple[int, int]:
    """(overwrites, those about another subject): versions replacing a key's content with a different statement,
    and those among them whose statement shares no identifier or value with the one it replaced (`_names`)."""
    total = foreign = 0
    for contents in history.values():
        for old, new in zip(contents, contents[1:]):
            if old is not None and new is not None and old != new:
                total += 1
                foreign += not (_names(old) & _names(new))
    return total, foreign


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


LABEL = re.compile(r"^(?:user|assistant|summary|system|tool)(?: \(paraphrase\))?: ")


def _split(text: str) -> list[str]:
    """`text` cut into sentences by plain regex: after `.`, `!` or `?`, white space and a capital, a backtick, a
    quote or a parenthesis (so "`pip install -e .` will" stays whole)."""
    return [p for p in re.split(r"(?<=[.!?])\s+(?=[A-Z`\"'(])", text.strip()) if p.strip()]


def _summary_sentences(summary: str) -> list[str]:
    """The sentences of a Summary's lines, each without its speaker label (plain regex)."""
    return [p for line in summary.splitlines() for p in _split(LABEL.sub("", line))]


def _qa(text: str) -> tuple[str | None, str]:
    """(question, answer) of a "Q: ... A: ..." entry, else (None, text): by plain regex."""
    match = re.match(r"Q: (.+?\?) A: (.+)\Z", text, re.DOTALL)
    return (match.group(1), match.group(2)) if match else (None, text)


def questionless(summary: str, conv: dict[str, Any]) -> int:
    """Reply sentences the Summary quotes (as a line's text, or part of it) whose turn's question is nowhere in it:
    the user's last sentence ending with "?", or its last clause (plain string tests)."""
    text = _plain(summary)
    count = 0
    for user, assistant in conv["turns"]:
        question = _split(user)[-1]
        if not question.endswith("?"):
            continue
        clause = re.split(r"[,;:]\s+", question)[-1]
        # A question in reply answers nothing.
        replies = [r for r in _split(assistant) if len(r.split()) >= 2 and not r.endswith("?")]
        if any(_plain(r).rstrip(".") in text for r in replies) and _plain(clause) not in text:
            count += 1
    return count


def _examples(components) -> tuple[str, ...]:
    """The worked examples the summarizer and the distiller declare."""
    return tuple(text for c in components for text in c.examples)


def score(out: Outcome, examples: tuple[str, ...]) -> dict[str, Any]:
    """The figures of one conversation (see the module docstring for the definitions)."""
    sources, conv = _sources(out.conv), out.conv
    contents = [content for _key, content, _conf in out.entries]
    recovered = [f for f in conv["facts"] if any(all(has_term(t, c) for t in f["terms"]) for c in contents)]
    precise = [c for c in contents if any(all(has_term(t, c) for t in f["terms"]) for f in conv["facts"])]
    as_true = [c for c in contents for r in conv.get("rejected", [])
               if all(has_term(t, c) for t in r["terms"]) and not fx.negated(c)]
    summary = out.summary or ""
    parts = fx.sentences(summary)
    norms = [fx.normalize(s) for s in parts]
    loops = bool(parts) and (len(set(norms)) < len(norms) or any(fx.looping(s) for s in parts))
    names = conv.get("key_names", [])
    return {
        "id": conv["id"], "entries": len(contents), "facts": len(conv["facts"]), "recovered": len(recovered),
        "supported": sum(fx.supported(c, sources) for c in contents),
        "verbatim": sum(fx.quoted(c, sources) or all(fx.quoted(p, sources) for p in (fx.qa_parts(c) or ()))
                        for c in contents),
        "precise": len(precise), "rejected_as_true": len(as_true), "rejected": len(conv.get("rejected", [])),
        "example_copies": sum(fx.matches_example(c, examples, sources) for c in contents),
        "vacuous": sum(fx.vacuous(c) for c in contents),
        "confidences": [conf for _k, _c, conf in out.entries],
        "summary": out.summary, "summary_ok": out.summary is not None,
        "coverage": sum(has_term(n, summary) for n in names) / len(names) if names else None,
        "loops": loops, "summary_example": any(fx.matches_example(s, examples, sources) for s in parts),
        "unterminated": bool(parts) and not fx.terminated(parts[-1]),
        "compression": len(fx.words(summary)) / max(1, len(fx.words(" ".join(sources)))),
        "questionless": questionless(summary, conv),
        "jobs": out.jobs,
        "good_keys": sum(key_quality(k, c) for k, c, _conf in out.entries),
        "plain_quoted": sum(all(in_source(p, sources) for p in _qa(c) if p is not None) for c in contents),
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
    covered = [r for r in rows if r["coverage"] is not None]
    return {
        "conversations": len(rows), "entries": entries, "facts": sum(r["facts"] for r in rows),
        "recovered": sum(r["recovered"] for r in rows),
        "recall": sum(r["recovered"] for r in rows) / max(1, sum(r["facts"] for r in rows)),
        "supported": sum(r["supported"] for r in rows), "unsupported": entries - sum(r["supported"] for r in rows),
        "verbatim": sum(r["verbatim"] for r in rows), "precise": sum(r["precise"] for r in rows),
        "rejected_as_true": sum(r["rejected_as_true"] for r in rows),
        "rejected_total": sum(r["rejected"] for r in rows),
        "example_copies": sum(r["example_copies"] for r in rows), "vacuous": sum(r["vacuous"] for r in rows),
        "distinct_confidences": len({round(c, 3) for c in confs}),
        "confidence_range": [min(confs), max(confs)] if confs else None,
        "summaries": len(summarized),
        "coverage": sum(r["coverage"] for r in covered if r["summary_ok"]) / max(1, len(covered)),
        "loops": sum(r["loops"] for r in rows), "summary_examples": sum(r["summary_example"] for r in rows),
        "unterminated": sum(r["unterminated"] for r in rows),
        "compression": sum(r["compression"] for r in summarized) / max(1, len(summarized)),
        "jobs": dict(Counter(f"{j['kind']}:{j['state']}" for j in jobs)),
        **{k: sum(r[k] for r in rows) for k in ("good_keys", "plain_quoted", "unsaid_numbers", "summary_sentences",
                                                "summary_unquoted", "summary_unsaid_numbers", "questionless")},
        "retries": sum(j["attempts"] for j in jobs),
    }


# -- the labelled set --------------------------------------------------------------------------------------------

KINDS = ("standalone", "fragment", "superseded", "proposal_alone", "episodic", "noise", "unlabelled")


def _said(label: dict[str, Any]) -> str:
    return _plain(label["said"]).rstrip(".")


def classify(content: str, labels: list[dict[str, Any]], superseded: set[str]) -> str:
    """The kind of a Knowledge entry (see the module docstring) from the labelled sentences it states; `superseded`
    holds the normalized sentences a later Session supersedes. Plain string tests: the entry's text (a Q/A entry's
    answer) is a labelled sentence, or holds labelled sentences whole, or is a piece of one (a fragment)."""
    question, answer = _qa(content)
    body = _plain(answer).rstrip(".")
    stated = [lab for lab in labels if _said(lab) == body] or [
        lab for lab in labels if re.search(r"(?<![\w`])" + re.escape(_said(lab)) + r"(?![\w`])", body)]
    if not stated:
        return "fragment" if any(body and body in _said(lab) for lab in labels) else "unlabelled"
    kinds = set()
    for lab in stated:
        kind = lab["kind"]
        if kind == "superseded" or _plain(lab["said"]) in superseded:
            kinds.add("superseded")
        elif kind == "proposal":
            kinds.add("standalone" if _plain(lab["rejection"]).rstrip(".") in _plain(content) else "proposal_alone")
        elif kind == "answer":
            asked = question is not None and _plain(lab["question"]).rstrip("?") in _plain(question)
            kinds.add("standalone" if asked else "fragment")
        elif kind == "fact":
            kinds.add("standalone")
        else:
            kinds.add(kind)
    return next(k for k in ("superseded", "proposal_alone", "noise", "episodic", "fragment", "standalone")
                if k in kinds)


def confidence_split(judged: list[tuple[float, bool]]) -> dict[str, Any]:
    """Of (confidence, correct) pairs: the median confidence, the share correct at or above it and below it, and
    whether the upper share is higher (or both are 1.0: nothing to separate)."""
    if not judged:
        return {"median": None, "high": None, "low": None, "separates": False}
    ordered = sorted(c for c, _ok in judged)
    median = ordered[len(ordered) // 2]
    high = [ok for c, ok in judged if c >= median]
    low = [ok for c, ok in judged if c < median]
    share_high = sum(high) / len(high)
    share_low = sum(low) / len(low) if low else None
    separates = share_low is not None and (share_high > share_low or share_high == share_low == 1.0)
    return {"median": median, "high": share_high, "low": share_low, "n_high": len(high), "n_low": len(low),
            "separates": separates}


def labelled_scores(outcomes: list[Outcome]) -> dict[str, Any]:
    """The figures of the labelled run: entries classified per workspace, key-fact recall, Summary decisions."""
    groups: dict[str, list[Outcome]] = {}
    for out in outcomes:
        groups.setdefault(out.conv.get("workspace", out.conv["id"]), []).append(out)
    kinds: Counter[str] = Counter()
    judged: list[tuple[float, bool]] = []
    entries_out: list[dict[str, Any]] = []
    facts = recovered = 0
    for group in groups.values():
        labels = [lab for o in group for lab in o.conv["labels"]]
        later = {_plain(s["said"]) for o in group for s in o.conv.get("supersedes", [])}
        contents = [c for _k, c, _conf in group[0].entries]
        for key, content, conf in group[0].entries:
            kind = classify(content, labels, later)
            kinds[kind] += 1
            judged.append((conf, kind == "standalone"))
            entries_out.append({"key": key, "content": content, "confidence": conf, "kind": kind})
        for o in group:
            for f in o.conv["facts"]:
                if any(all(has_term(t, s) for t in f["terms"]) for s in later):
                    continue  # a later Session changed it
                facts += 1
                recovered += any(all(has_term(t, c) for t in f["terms"]) for c in contents)
    entries = sum(kinds.values())
    rows = [{"id": o.conv["id"], "summary": o.summary,
             "decision_kept": o.summary is not None and all(has_term(t, o.summary) for t in o.conv["decision"]),
             "questionless": questionless(o.summary or "", o.conv)} for o in outcomes]
    return {"conversations": len(outcomes), "workspaces": len(groups), "entries": entries,
            "kinds": {k: kinds.get(k, 0) for k in KINDS},
            "standalone_share": kinds["standalone"] / max(1, entries),
            "fragment_share": kinds["fragment"] / max(1, entries),
            "facts": facts, "recovered": recovered, "recall": recovered / max(1, facts),
            "decisions_missed": sum(not r["decision_kept"] for r in rows),
            "questionless": sum(r["questionless"] for r in rows),
            "confidence": confidence_split(judged), "rows": rows, "entry_kinds": entries_out}


def invented_speaker_lines(outcomes: list[Outcome]) -> dict[str, Any]:
    """Of the stored Summaries: how many there are, and their lines labelled "user: " or "assistant: " whose
    sentences are not all verbatim words of that speaker (plain string tests)."""
    lines = invented = 0
    for out in outcomes:
        said = {"user": [u for u, _a in out.conv["turns"]], "assistant": [a for _u, a in out.conv["turns"]]}
        for line in (out.summary or "").splitlines():
            match = re.match(r"(user|assistant): ", line)
            if not match:
                continue
            lines += 1
            parts = _summary_sentences(line)
            invented += not all(in_source(p, said[match.group(1)]) for p in parts)
    return {"summaries": sum(o.summary is not None for o in outcomes), "conversations": len(outcomes),
            "labelled_lines": lines, "invented": invented}


def shared_scores(outcomes: list[Outcome], run: dict[str, Any]) -> dict[str, Any]:
    """The figures of the shared-workspace run: every Session distilled into one workspace."""
    entries = outcomes[0].entries if outcomes else []
    contents = [c for _k, c, _conf in entries]
    sources = [text for o in outcomes for text in _sources(o.conv)]
    facts = [f for o in outcomes for f in o.conv["facts"]]
    total, foreign = overwrites(outcomes[0].history if outcomes else {})
    return {"sessions": len(outcomes), "entries": len(entries), "overwrites": total, "foreign_overwrites": foreign,
            "good_keys": sum(key_quality(k, c) for k, c, _conf in entries),
            "recovered": sum(any(all(has_term(t, c) for t in f["terms"]) for c in contents) for f in facts),
            "facts": len(facts),
            "plain_quoted": sum(all(in_source(p, sources) for p in _qa(c) if p is not None) for c in contents),
            "seconds": run["seconds"]}


# -- the figures, the checks and the section: pure functions of the recorded figures -----------------------------


def checks(fig: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(target name, what it measures, figure) for every target the recorded figures `fig` have."""
    t = fig["heldout"]["totals"]
    out = [("unsupported", "entries not supported by the source", t["unsupported"]),
           ("example_copies", "worked-example copies", t["example_copies"]),
           ("recall", "known facts recovered (recall)", round(t["recall"], 3)),
           ("coverage", "Summary key-name coverage", round(t["coverage"], 3)),
           ("loops", "Summaries with a repetition loop", t["loops"]),
           ("questionless", "question-less answers in Summaries (held-out)", t["questionless"])]
    if fig.get("shared"):
        out.append(("foreign_overwrites", "overwrites about another subject (shared workspace)",
                    fig["shared"]["foreign_overwrites"]))
    lab = fig.get("labelled")
    if lab:
        out += [("standalone_share", "labelled: standalone durable facts, share of entries",
                 round(lab["standalone_share"], 3)),
                ("superseded", "labelled: superseded values stated as current", lab["kinds"]["superseded"]),
                ("proposals_alone", "labelled: rejected proposals without their rejection",
                 lab["kinds"]["proposal_alone"]),
                ("fragment_share", "labelled: fragments, share of entries", round(lab["fragment_share"], 3)),
                ("noise", "labelled: content-free entries", lab["kinds"]["noise"]),
                ("labelled_recall", "labelled: key-fact recall", round(lab["recall"], 3)),
                ("decisions_missed", "labelled: Summaries missing the main decision", lab["decisions_missed"]),
                ("labelled_questionless", "labelled: question-less answers in Summaries", lab["questionless"]),
                ("confidence_separates", "labelled: higher-confidence entries more often standalone facts",
                 lab["confidence"]["separates"])]
    if fig.get("abstractive"):
        out.append(("invented_speaker_lines", "labelled, abstractive Summaries: invented speaker lines",
                    fig["abstractive"]["invented"]))
    return out


def misses(fig: dict[str, Any]) -> list[str]:
    """The targets the recorded figures miss, as "what: figure (target)"."""
    return [f"{what}: {value} (target {target_text(name, value)})" for name, what, value in checks(fig)
            if not met(name, value)]


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render(fig: dict[str, Any]) -> str:
    """The Markdown section for RESULTS.md: a pure function of the recorded figures `fig`."""
    run, t, rows = fig["run"], fig["heldout"]["totals"], fig["heldout"]["rows"]
    rng = t["confidence_range"]
    conf = f"{t['distinct_confidences']} distinct values" + (f", {rng[0]:.2f}-{rng[1]:.2f}" if rng else "")
    jobs = ", ".join(f"{n} {k}" for k, n in sorted(t["jobs"].items()))
    check = {name: target_text(name, value) for name, _what, value in checks(fig)}
    lines = [
        f"## {fig['title']} (`bench_quality.py`), {fig['measured']}",
        "",
        f"Model: `{run['model']}` (`{run['model_file']}`), context window {run['context_window']} tokens; "
        f"settings: {fig['settings']}. {t['conversations']} conversations of `benchmarks/quality/{fig['data']}`, "
        f"{t['facts']} known facts; jobs: {jobs}, {t['retries']} failed attempts retried; "
        f"{run['seconds']:.0f} s of worker time on a shared 2-core machine (figures under this shared load are "
        f"noisy only in time). Produced by `{fig['command']}`.",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        f"| Knowledge entries saved | {t['entries']} | |",
        f"| entries not supported by the source | {t['unsupported']} of {t['entries']} | {check['unsupported']} |",
        f"| entries quoted verbatim from the source (a Q/A entry: both parts) | {t['verbatim']} of {t['entries']} | |",
        f"| known facts recovered (recall) | {t['recovered']} of {t['facts']} ({t['recall']:.2f}) | "
        f"{check['recall']} |",
        f"| entries that state a known fact (precision) | {t['precise']} of {t['entries']} | |",
        f"| entries saved per known fact | {t['entries'] / max(1, t['facts']):.2f} | |",
        f"| rejected proposals stored as true | {t['rejected_as_true']} of {t['rejected_total']} | |",
        f"| worked-example copies | {t['example_copies']} | {check['example_copies']} |",
        f"| vacuous entries (fewer than two content words) | {t['vacuous']} | |",
        f"| confidence | {conf} | measured, not constant |",
        f"| Summaries written | {t['summaries']} of {t['conversations']} | |",
        f"| Summary key-name coverage (mean; a missing Summary counts 0) | {t['coverage']:.2f} | {check['coverage']} |",
        f"| Summaries with a repetition loop | {t['loops']} | {check['loops']} |",
        f"| Summary answers quoted without their question | {t['questionless']} | {check['questionless']} |",
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
        f"| entries whose text (each part of a Q/A entry) occurs in the source (ignoring case, spacing, a final "
        f"full stop) | {t['plain_quoted']} of {t['entries']} |",
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
                     f"{r['rejected_as_true']} | {r['coverage']:.2f} | {_yes(r['loops'])} |")
    if fig.get("shared"):
        lines += shared_report(fig["shared"], t["entries"], check)
    if fig.get("labelled"):
        lines += labelled_report(fig["labelled"], fig.get("abstractive"), check)
    missed = misses(fig)
    lines += ["", "Result: every target met." if not missed else
              "Result: **targets missed**: " + "; ".join(missed) + "."]
    return "\n".join(lines)


def shared_report(sh: dict[str, Any], separate_entries: int, check: dict[str, str]) -> list[str]:
    """The shared-workspace lines of the section."""
    return [
        "",
        f"Shared workspace: the same {sh['sessions']} conversations as Sessions of *one* workspace, each distilled "
        f"by its own job against the Knowledge the earlier jobs saved ({sh['seconds']:.0f} s of worker time).",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        f"| Knowledge entries in the workspace | {sh['entries']} (separate workspaces: {separate_entries}) | |",
        f"| versions that replaced an entry's content with a different statement (overwrites) | "
        f"{sh['overwrites']} | |",
        f"| of them about another subject (no identifier or value in common: not a supersession) | "
        f"{sh['foreign_overwrites']} | {check['foreign_overwrites']} |",
        f"| keys of two or more of the entry's own words | {sh['good_keys']} of {sh['entries']} | |",
        f"| known facts recovered | {sh['recovered']} of {sh['facts']} | |",
        f"| entries whose text occurs in the source (guard-independent) | {sh['plain_quoted']} of {sh['entries']} | |",
    ]


def labelled_report(lab: dict[str, Any], ab: dict[str, Any] | None, check: dict[str, str]) -> list[str]:
    """The labelled-set lines of the section."""
    k, n, c = lab["kinds"], lab["entries"], lab["confidence"]
    low = "n/a" if c["low"] is None else f"{c['low']:.2f} of {c['n_low']}"
    high = "n/a" if c["high"] is None else f"{c['high']:.2f} of {c['n_high']}"
    lines = [
        "",
        f"Labelled set: {lab['conversations']} conversations of `benchmarks/quality/labelled.json` in "
        f"{lab['workspaces']} workspaces, written with every statement's kind before any run (the rules of this "
        "issue were then developed against them, so these figures show the rules work as meant, not how they "
        "generalize: the held-out figures above are that). Each entry is classified by the labelled sentences it "
        "states.",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        f"| Knowledge entries | {n} | |",
        f"| standalone durable facts | {k['standalone']} ({lab['standalone_share']:.2f}) | "
        f"{check['standalone_share']} |",
        f"| superseded values stated as current | {k['superseded']} | {check['superseded']} |",
        f"| rejected proposals without their rejection | {k['proposal_alone']} | {check['proposals_alone']} |",
        f"| fragments | {k['fragment']} ({lab['fragment_share']:.2f}) | {check['fragment_share']} |",
        f"| content-free entries (noise) | {k['noise']} | {check['noise']} |",
        f"| episodic entries | {k['episodic']} | |",
        f"| entries of no labelled sentence | {k['unlabelled']} | |",
        f"| key facts recovered (recall) | {lab['recovered']} of {lab['facts']} ({lab['recall']:.2f}) | "
        f"{check['labelled_recall']} |",
        f"| standalone share at or above the median confidence ({c['median']}) / below it | {high} / {low} | "
        f"{check['confidence_separates']} |",
        f"| Summaries missing the main decision | {lab['decisions_missed']} of {lab['conversations']} | "
        f"{check['decisions_missed']} |",
        f"| Summary answers quoted without their question | {lab['questionless']} | "
        f"{check['labelled_questionless']} |",
    ]
    if ab:
        lines.append(f"| abstractive Summaries (`summary_mode=abstractive`): invented speaker lines | "
                     f"{ab['invented']} of {ab['labelled_lines']} labelled lines in {ab['summaries']} Summaries "
                     f"stored ({ab['conversations'] - ab['summaries']} rejected by the guards) | "
                     f"{check['invented_speaker_lines']} |")
    lines += ["", "| conversation | main decision kept | question-less answers |", "| --- | --- | --- |"]
    lines += [f"| {r['id']} | {_yes(r['decision_kept'])} | {r['questionless']} |" for r in lab["rows"]]
    return lines


def _load(name: str) -> list[dict[str, Any]]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))["conversations"]


def _print_outcomes(rows: list[dict[str, Any]], outcomes: list[Outcome]) -> None:
    for r, out in zip(rows, outcomes):
        print(f"\n== {r['id']}: {r['recovered']}/{r['facts']} facts, {r['entries']} entries "
              f"({r['supported']} supported), loops {r['loops']}")
        print(f"   summary: {r['summary']!r}")
        for key, content, conf in out.entries:
            print(f"   [{conf:.2f}] {key}: {content}")
        for job in r["jobs"]:
            print(f"   job {job['kind']} {job['state']} attempts={job['attempts']} result={job['result']} "
                  f"diagnostics={job['diagnostics']}")


def measure(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Run the pipeline as `args` ask and return the figures to record."""
    # One thread: on this shared 2-core machine two llama.cpp threads contending with other work generate ~10x
    # slower; the thread count does not change what greedy decoding chooses.
    overrides = {"model_threads": "1", **dict(item.split("=", 1) for item in args.set)}
    data_file = "dev.json" if args.dev else "heldout.json"
    convs = [c for c in _load(data_file) if not args.only or c["id"] in args.only]
    outcomes, run = run_pipeline(convs, overrides)
    rows = [score(o, run["examples"]) for o in outcomes]
    _print_outcomes(rows, outcomes)
    fig: dict[str, Any] = {
        "title": args.title,
        "command": " ".join(["python", "benchmarks/bench_quality.py", *(shlex.quote(a) for a in argv)]),
        "settings": ", ".join(f"`{k}={v}`" for k, v in overrides.items()) or "defaults", "data": data_file,
        "run": {k: v for k, v in run.items() if k != "examples"},
        "heldout": {"totals": totals(rows), "rows": [{k: v for k, v in r.items() if k != "jobs"} for r in rows]},
    }
    if not args.no_shared:
        shared, shared_run = run_pipeline(convs, overrides, shared=True)
        fig["shared"] = shared_scores(shared, shared_run)
    if not args.no_labelled:
        labelled, _run = run_pipeline(_load("labelled.json"), overrides)
        _print_outcomes([score(o, run["examples"]) for o in labelled], labelled)
        fig["labelled"] = labelled_scores(labelled)
        abstractive, _run = run_pipeline(_load("labelled.json"), {**overrides, "summary_mode": "abstractive"})
        for o in abstractive:
            print(f"   abstractive summary {o.conv['id']}: {o.summary!r}")
        fig["abstractive"] = invented_speaker_lines(abstractive)
    return fig


RESULTS = results.RESULTS  # the results file this script writes (a test points it at a copy)


def publish(name: str, fig: dict[str, Any]) -> str:
    """Write the section `name` of RESULTS.md from `fig` (`results.publish` with this script's `render`); return
    that rendering."""
    return results.publish(name, render, fig, RESULTS)


def recorded(name: str) -> dict[str, Any]:
    """The figures recorded in the section `name` of RESULTS.md."""
    return results.recorded(RESULTS)[name][0]


def main(argv: list[str]) -> int:
    """Run (or, with `--render`, re-render) the benchmark; 1 when a target is missed, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="store_true", help="run the development set (never written to RESULTS.md)")
    parser.add_argument("--only", action="append", default=[], help="run only this conversation ID (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    parser.add_argument("--no-shared", action="store_true", help="skip the shared-workspace run")
    parser.add_argument("--no-labelled", action="store_true", help="skip the labelled set")
    parser.add_argument("--render", action="store_true", help="render the section from the figures it records; "
                        "run nothing")
    parser.add_argument("--section", default="quality", help="RESULTS.md section to write (default: quality)")
    parser.add_argument("--title", default="Quality", help="the section's heading (default: Quality)")
    args = parser.parse_args(argv)
    write = not (args.dev or args.no_write or args.only)
    if args.render:
        fig = recorded(args.section)
    else:
        if importlib.util.find_spec("llama_cpp") is None:
            print("quality: skipped (llama-cpp-python is not installed)")
            return 0
        try:
            default_model_file()
        except DefaultModelUnavailableError as exc:
            print(f"quality: skipped ({exc})")
            return 0
        fig = {"measured": datetime.date.today().isoformat(), **measure(args, argv)}
    print("\n" + render(fig) + "\n")
    for name, what, value in checks(fig):
        print(f"{what}: {value}  target {target_text(name, value)}")
    if write:
        publish(args.section, fig)
    return 1 if misses(fig) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
