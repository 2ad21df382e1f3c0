"""Tests of emelex_memory/knowledge/."""
