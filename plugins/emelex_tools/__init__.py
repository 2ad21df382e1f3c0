"""The built-in agent tools plugin: file tools confined to the Session's workspace and an approved command runner."""
