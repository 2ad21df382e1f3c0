"""Tests of the built-in plugins under plugins/."""
