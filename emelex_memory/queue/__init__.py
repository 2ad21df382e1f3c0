"""The durable work queues: job records and kinds, sources, claims and their renewal, and the library runner."""
