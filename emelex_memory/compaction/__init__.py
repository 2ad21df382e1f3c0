"""Compaction: the policy, planning and steps, the source prefix digest, Summaries and their verification, reverting."""
