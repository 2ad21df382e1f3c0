"""Tests of emelex_memory/snapshots/."""
