"""The agent layer: tools as plugins (`tools`), the constrained tool-call protocol (`protocol`), the in-memory
`AgentSession` (`session`) and the durable adapter pairing it with a Session lease (`durable`)."""
