"""Tests of emelex_memory/core/."""
