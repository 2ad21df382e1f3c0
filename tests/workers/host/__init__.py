"""Tests of emelex_workers/host/."""
