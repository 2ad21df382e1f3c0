"""Typed errors of the tool protocol and chat (EmelexError subclasses; each docstring says what to do).

They live here rather than in `emelex_memory/errors.py` because the core
never raises them: only the agent layer (protocol, session, chat) does.
"""

from __future__ import annotations

from emelex_memory import EmelexError, InvalidInputError


class RoundOutputError(EmelexError):
    """A model round was not valid protocol output (cut off by the token limit, or not the union JSON): the turn
    fails with this diagnostic; ask again, raise the round token limit, or use a larger model."""


class UnknownToolError(InvalidInputError):
    """The named tool is not among this Session's tools: `/tools` lists them (only snapshot tools can be disabled
    or enabled)."""
