"""Tests of emelex_memory/queue/."""
