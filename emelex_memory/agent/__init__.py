"""The durable core of the agent adapter: execution snapshots and the active-turn and tool-call journal."""
