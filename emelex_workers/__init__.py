"""Emelex workers: the plugin host, the worker, model management, the agent and the `emelex` command line.

One folder per concept, the arrows pointing down: `host/` (hookspecs, the plugin manager, the types plugins
exchange) and `models/` (the model manager) import nothing else of emelex_workers; `faithfulness/` (the checks
and the guards), `worker/` (the run loop) and `agent/` (tools, protocol, sessions) build on them; `cli/` (the
`emelex` commands) is the top floor, with `demo/` (the drivers behind `make demo`) over it.
`plugin_api` and `hookspecs` are the stable import paths for plugin authors (docs/plugins.md).
"""
