"""Tests of emelex_workers/agent/."""
