"""The "open" turn policy: for a model that can carry its own turn (a capable local model, or a served one).

Every enabled tool is offered in every round with its arguments constrained only by its own schema, the answer is
the model's own words (free, bounded by the round's tokens), and only the chain limit forces an answer. Where the
binding calls tools natively (a served model whose server supports it) the tools go in the OpenAI `tools` field and
the messages read as that API's tool calls and results; otherwise each round is the constrained JSON union. The
execution gate still checks every call against the snapshot, and a call the round did not offer is refused.
"""

from __future__ import annotations

from emelex_workers.host.policies import TurnPolicy


class OpenPolicy(TurnPolicy):
    """Every enabled tool, arguments as their schemas allow, a free answer, an answer forced only at the chain limit
    (see the module docstring): `TurnPolicy` as it is, named."""

    name = "open"
    version = 1
    summary = TurnPolicy.summary
