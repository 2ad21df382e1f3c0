"""The workers' settings: the core's `Settings` and the fields of the worker, the model manager, the agent and the
built-in plugins, read the same way (arguments, `EMELEX_*` variables, `<Home>/config.toml`, defaults).

`WorkerSettings` is what the `emelex` command, the worker (`emelex memory work`), the agent and the plugins are
given; a store opened with it keeps it as `store.settings`. It is registered in the `emelex.settings` entry-point
group, so that the core's own `Settings` does not take its keys in config.toml for unknown settings
(`emelex_memory/core/settings.py`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from emelex_memory import Settings


class WorkerSettings(Settings):
    """Every tunable of Emelex: the store's (`emelex_memory.Settings`) and those of the plugins, the models, the
    worker and the agent, with safe defaults."""

    # The plugin host (`emelex_workers/host`).
    plugins_autoload: bool = Field(
        default=True, description="Load third-party plugins from the 'emelex' entry-point group; built-ins always load."
    )
    plugins_trace: bool = Field(default=False, description="Trace every plugin hook call to stderr.")

    # Models: which one the worker uses, and how a binding allocates it (`emelex_workers/models`, the plugins).
    default_model: str = Field(
        default="smollm2-135m-instruct", min_length=1, max_length=64, description="Installed model the worker uses."
    )
    model_max_context_tokens: int = Field(
        default=8192, ge=256, le=1_048_576, description="Largest context window a model binding allocates."
    )
    model_threads: int | None = Field(default=None, ge=1, le=256, description=(
        "CPU threads a model binding uses; unset: chosen when the work starts from the usable, idle cores."))

    # The worker (`emelex memory work`): its summarizer and distiller, and how long a run lasts.
    summarizer: str = Field(default="llamacpp", min_length=1, max_length=64, description="Summarizer the worker uses.")
    distiller: str = Field(default="llamacpp", min_length=1, max_length=64, description="Distiller the worker uses.")
    work_max_jobs: int = Field(default=100, ge=1, le=1_000_000, description="Jobs one worker run takes at most.")
    work_max_seconds: float = Field(
        default=3600.0, gt=0, le=86_400, description="Seconds after which a worker run claims no further job."
    )

    # The built-in llama.cpp plugin's summarizer and distiller (`emelex_llamacpp`).
    summary_mode: Literal["extractive", "abstractive"] = Field(
        default="extractive", description="Built-in summarizer: quote the source's statements, or write freely."
    )
    distill_mode: Literal["extractive", "abstractive"] = Field(
        default="extractive", description="Built-in distiller: quote the source's statements, or write freely."
    )

    # The built-in plugin for served models (`emelex_openai`).
    served_connect_timeout_s: float = Field(
        default=5.0, gt=0, le=600, description="Served models: longest wait to connect to the model server."
    )
    served_read_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="Served models: longest silence while the server answers."
    )
    served_request_timeout_s: float = Field(
        default=600.0, gt=0, le=86_400, description="Served models: longest one request may take in all."
    )
    served_retries: int = Field(
        default=3, ge=0, le=20, description="Served models: retries of a refused connection, HTTP 429 or 5xx."
    )

    # Hybrid search: the embedder whose vectors `emelex memory work` stores and `emelex memory search` fuses with full
    # text (the plugin that provides it: `embedder` hook; the built-in llamacpp and openai plugins).
    embedder: str | None = Field(default=None, min_length=1, max_length=64, description=(
        "Embedder whose vectors search fuses with full text (built-in: \"llamacpp\", a local GGUF embedding model; "
        "\"openai\", a served /v1/embeddings endpoint); unset: full text alone."))
    embedding_model: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "The embedder's model: for llamacpp the path of a GGUF file, for openai the model name the server knows."))
    embedding_url: str | None = Field(default=None, min_length=1, max_length=2048, description=(
        "For the openai embedder: the server's base URL, e.g. http://127.0.0.1:8080/v1."))

    # The agent: the turn policy of a new chat Session and the Knowledge it recalls (`emelex_workers/agent`).
    chat_policy: str = Field(
        default="auto", pattern=r"^[a-z][a-z0-9_]{0,47}$", description="Turn policy of a new chat Session: 'guided' "
        "(answers quote what was read), 'open' (the model's own words), a plugin's, or 'auto' (guided for a local "
        "model under 1B parameters, open otherwise)."
    )
    recall_budget_tokens: int = Field(
        default=512, ge=1, le=1_000_000, description="Most tokens of Knowledge notes a new chat Session recalls (and "
        "never more than a tenth of the model's window)."
    )
