"""Emelex workers: plugins, the worker runner, model management and the `emelex` command line."""
