"""Tests of emelex_memory/sessions/."""
