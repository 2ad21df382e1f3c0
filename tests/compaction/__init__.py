"""Tests of emelex_memory/compaction/."""
