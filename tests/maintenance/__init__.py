"""Tests of emelex_memory/maintenance/."""
