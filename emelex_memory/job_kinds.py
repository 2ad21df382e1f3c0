"""The job-kind registry with Emelex's built-in kinds registered: what `emelex_memory` exports as
`register_job_kind` and `registered_kinds`.

A kind is registered when the module that handles it is imported (`compaction/planning.py`,
`knowledge/distillation.py`); the package imports its modules lazily, so the registry is reached through here,
which imports both first.
"""

from __future__ import annotations

from .compaction.planning import COMPACTION_KIND
from .knowledge.distillation import DISTILL_KIND
from .queue.jobs import register_job_kind, registered_kinds

BUILT_IN_KINDS = (COMPACTION_KIND, DISTILL_KIND)

__all__ = ["BUILT_IN_KINDS", "register_job_kind", "registered_kinds"]
