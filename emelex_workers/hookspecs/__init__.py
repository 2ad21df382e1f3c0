"""The stable import path of the hook specifications (docs/plugins.md): `hookimpl` marks a plugin's hook
implementations. Re-exports `emelex_workers.host.hookspecs`, the specifications themselves included.
"""

from emelex_workers.host.hookspecs import (
    PROJECT_NAME,
    check_model,
    embedder,
    hookimpl,
    hookspec,
    model_binding,
    register_distillers,
    register_summarizers,
    register_tools,
)

__all__ = ["PROJECT_NAME", "check_model", "embedder", "hookimpl", "hookspec", "model_binding", "register_distillers", "register_summarizers",
           "register_tools"]
