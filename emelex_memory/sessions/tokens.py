"""What a transcript event costs in tokens when no tokenizer is at hand: `TokenCounter` and `estimate_tokens`.

A module of its own, importing nothing at run time, so that `MemoryStore`'s written face can name
`estimate_tokens` as the default of the methods that count (`plan_compaction`, ...) without loading the
compaction code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .transcript import Event

TokenCounter = Callable[["Event"], int]


def estimate_tokens(event: Event) -> int:
    """A tokenizer-free estimate: one token per 4 bytes of the event's canonical JSON, rounded up."""
    return (event.size + 3) // 4
