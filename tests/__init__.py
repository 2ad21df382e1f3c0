"""Emelex Memory test suite."""
