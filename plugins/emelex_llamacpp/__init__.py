"""Built-in llama.cpp plugin for Emelex Memory."""
