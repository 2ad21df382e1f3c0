"""The built-in job kinds and the default registry: what `emelex_memory` exports as `register_job_kind` and
`registered_kinds`.

`builtin_kinds()` is a new `JobKindRegistry` with compaction and distillation, registered by where they live
(`compaction/planning.py: COMPACTION_JOB_KIND`, `knowledge/distillation.py: DISTILL_JOB_KIND`), so building
it imports neither: a store that never completes or validates such a job never loads those modules.
`DEFAULT_KINDS` is the one every store uses unless it is given its own.
"""

from __future__ import annotations

from .queue.kinds import JobKindRegistry

COMPACTION_KIND = "compaction"
DISTILL_KIND = "distill"
BUILT_IN_KINDS = (COMPACTION_KIND, DISTILL_KIND)
_WHERE = {
    COMPACTION_KIND: "emelex_memory.compaction.planning:COMPACTION_JOB_KIND",
    DISTILL_KIND: "emelex_memory.knowledge.distillation:DISTILL_JOB_KIND",
}


def builtin_kinds() -> JobKindRegistry:
    """A new registry holding exactly the built-in kinds (compaction and distill); add test or plugin kinds to it."""
    registry = JobKindRegistry()
    for name, where in _WHERE.items():
        registry.register_deferred(name, where)
    return registry


DEFAULT_KINDS = builtin_kinds()
register_job_kind = DEFAULT_KINDS.register
registered_kinds = DEFAULT_KINDS.names

__all__ = [
    "BUILT_IN_KINDS", "COMPACTION_KIND", "DEFAULT_KINDS", "DISTILL_KIND", "builtin_kinds", "register_job_kind",
    "registered_kinds",
]
