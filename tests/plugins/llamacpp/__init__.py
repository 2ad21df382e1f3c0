"""Tests of plugins/emelex_llamacpp/."""
