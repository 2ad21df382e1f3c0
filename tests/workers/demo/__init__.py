"""Tests of emelex_workers/demo/."""
