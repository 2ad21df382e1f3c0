"""Tests of emelex_workers/cli/."""
