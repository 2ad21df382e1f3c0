"""Tests of emelex_workers/worker/."""
