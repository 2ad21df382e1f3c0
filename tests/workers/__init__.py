"""Tests of emelex_workers/."""
