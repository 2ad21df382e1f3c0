"""Tests of emelex_memory/assets/."""
