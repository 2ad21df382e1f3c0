"""The plugin host: the hook specifications (`hookspecs`), the plugin manager that loads and calls plugins
(`manager`) and the types plugins exchange with Emelex (`types`: model bindings, summarizers, distillers and
their requests).

Imports emelex_memory and nothing else of emelex_workers. A third-party plugin imports the stable re-exports,
`emelex_workers.plugin_api` and `emelex_workers.hookspecs`, rather than these modules.
"""
