"""Full-text search over a workspace's Knowledge and Session transcripts, and the recall selection built on it."""
