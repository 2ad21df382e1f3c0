"""What faithful output means and the guards that enforce it: the plain text checks (`checks`: support, vacuity,
worked-example matches, Summary cleaning) and the rule-made records of tool rounds and failed turns (`records`),
which plugins may use too, and the guards the worker applies to every summarizer's and distiller's output
(`guards`).

`checks` imports nothing of emelex_workers, `records` only emelex_memory; `guards` imports
emelex_memory, the host's types and the attempts' wording (`worker.attempts`). The names below are the checks'
and the records' public API, and `guard_candidates`, which the built-in `remember` tool applies as
distillation does.
"""

from .checks import (
    CODE_SPAN,
    EXAMPLE_JACCARD,
    MIN_CONTENT_WORDS,
    NEGATIONS,
    PARAPHRASE,
    SPEAKER_LABEL,
    STOP_WORDS,
    SUMMARY_META,
    SummaryCheck,
    check_summary,
    claim_supported,
    content_words,
    corroboration,
    is_invented,
    json_shaped,
    key_names,
    looping,
    matches_example,
    negated,
    normalize,
    qa,
    qa_parts,
    quoted,
    sentences,
    stem,
    summary_lines,
    support,
    supported,
    interjection,
    terminated,
    vacuous,
    vocatives,
    words,
)
from .said import agent_session, excluded
from .guards import guard_candidates
from .records import call_record, failure_record, machinery_records, record_texts

__all__ = [
    "CODE_SPAN", "EXAMPLE_JACCARD", "MIN_CONTENT_WORDS", "NEGATIONS", "PARAPHRASE", "SPEAKER_LABEL", "STOP_WORDS",
    "SUMMARY_META", "SummaryCheck", "call_record", "check_summary", "claim_supported", "content_words", "corroboration",
    "failure_record", "is_invented", "json_shaped", "key_names", "looping", "machinery_records", "matches_example",
    "negated", "normalize", "qa", "qa_parts", "quoted", "record_texts", "sentences", "stem", "summary_lines", "support",
    "supported", "terminated", "vacuous", "words", "guard_candidates", "interjection", "vocatives", "agent_session", "excluded",
]
