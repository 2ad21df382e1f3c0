"""Built-in plugin for models served over an OpenAI-compatible HTTP API (Ollama, llama-server, vLLM, ...)."""
