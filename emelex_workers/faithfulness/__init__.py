"""What faithful output means and the guards that enforce it: the plain text checks (`checks`: support, vacuity,
worked-example matches, Summary cleaning), which plugins may use too, and the guards the worker applies to every
summarizer's and distiller's output (`guards`).

`checks` imports nothing of emelex_workers; `guards` imports emelex_memory, the host's types and the attempts'
wording (`worker.attempts`). The names below are the checks' public API, and `guard_candidates`, which the
built-in `remember` tool applies as distillation does.
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
    support,
    supported,
    terminated,
    vacuous,
    words,
)
from .guards import guard_candidates

__all__ = [
    "CODE_SPAN", "EXAMPLE_JACCARD", "MIN_CONTENT_WORDS", "NEGATIONS", "PARAPHRASE", "SPEAKER_LABEL", "STOP_WORDS", "SUMMARY_META",
    "SummaryCheck", "check_summary", "claim_supported", "content_words", "corroboration", "is_invented", "key_names",
    "looping", "matches_example", "negated", "normalize", "qa", "qa_parts", "quoted", "sentences", "stem", "support",
    "supported", "terminated", "vacuous", "words", "guard_candidates",
]
