"""The agent layer: tools as plugins (`tools`), the tool-call protocols (`protocol`), the turn policies that guide a
turn (`policies`), the workspace walk of a turn (`workspace`), the in-memory `AgentSession` (`session`) and the
durable adapter pairing it with a Session lease (`durable`)."""
