"""Tests of emelex_workers/faithfulness/."""
