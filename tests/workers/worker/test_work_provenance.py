"""Plugin provenance: every Summary and Knowledge version names the plugin that produced it (entry point,
distribution and version, the summarizer's or distiller's name and mode), verified with the Summary, and shown by
`sessions show`, `knowledge history` and `jobs list` (and their --json)."""

from __future__ import annotations

import json
from pathlib import Path

import apsw
import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, SummaryProvenanceError
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings
from emelex_workers.worker.work import work

from .test_work import env, jobs, seed  # noqa: F401 - env is a fixture

SUMMARIZER = {"plugin": "fake", "distribution": "emelex-fakeplugin", "version": "1.2.3", "kind": "summarizer",
              "name": "fake"}
DISTILLER = {**SUMMARIZER, "kind": "distiller"}


def test_what_the_worker_writes_names_its_plugin(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace)
        assert work(store, env).counts["done"] == 2
        summary = store.replay(sid).events[0]  # replay verifies the provenance, the producer included
        assert summary.payload["provenance"]["producer"] == SUMMARIZER
        history = store.knowledge_history(workspace, "fact-2", 0).versions
        assert [v.producer for v in history] == [DISTILLER] and history[0].origin == "distillation"
        by_kind = jobs(store)
        assert by_kind["compaction"].result["producer"] == SUMMARIZER
        assert by_kind["distill"].result["producer"] == DISTILLER
    runner = CliRunner()
    shown = runner.invoke(app, ["memory", "sessions", "show", sid]).output
    assert ("source events, by summarizer 'fake' of plugin 'fake' from emelex-fakeplugin 1.2.3" in shown), shown
    history = runner.invoke(app, ["memory", "knowledge", "history", "fact-2", "--workspace", str(workspace)]).output
    assert "      by:     distiller 'fake' of plugin 'fake' from emelex-fakeplugin 1.2.3" in history, history
    data = json.loads(runner.invoke(app, ["memory", "knowledge", "history", "fact-2", "--workspace", str(workspace),
                                          "--json"]).output)
    assert data["versions"][0]["producer"] == DISTILLER
    listed = runner.invoke(app, ["memory", "jobs", "list"]).output
    assert "by summarizer 'fake' of plugin 'fake' from emelex-fakeplugin 1.2.3" in listed
    assert "by distiller 'fake' of plugin 'fake' from emelex-fakeplugin 1.2.3" in listed
    listed = json.loads(runner.invoke(app, ["memory", "jobs", "list", "--json"]).output)
    assert {j["kind"]: j["result"]["producer"] for j in listed["jobs"]} == {"compaction": SUMMARIZER,
                                                                          "distill": DISTILLER}


def test_the_built_in_plugin_records_its_mode(env: WorkerSettings, workspace: Path) -> None:
    from emelex_workers.host.manager import distillers, get_plugin_manager, summarizers

    pm = get_plugin_manager(WorkerSettings(summary_mode="abstractive"))
    assert summarizers(pm)["llamacpp"].component.mode == "abstractive"
    assert distillers(pm)["llamacpp"].component.mode == "extractive"


def test_an_altered_producer_fails_the_summary_s_verification(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        sid = seed(store, workspace, distill=False)
        work(store, env)
    conn = apsw.Connection(str(env.database_path))
    conn.execute("UPDATE summaries SET producer = ?", (json.dumps({**SUMMARIZER, "plugin": "other"}),))
    conn.close()
    with MemoryStore.open(env) as store, pytest.raises(SummaryProvenanceError, match="provenance differs"):
        store.replay(sid)


def test_a_version_written_by_hand_names_no_producer(env: WorkerSettings, workspace: Path) -> None:
    with MemoryStore.open(env) as store:
        assert store.remember(workspace, "k", "a fact the user typed", confidence=1.0).producer is None


def test_tracing_names_the_summarizer_and_distiller_calls(env: WorkerSettings, workspace: Path, capsys) -> None:
    with MemoryStore.open(env) as store:
        seed(store, workspace)
        capsys.readouterr()
        work(store, WorkerSettings(plugins_trace=True))
    err = capsys.readouterr().err.splitlines()
    calls = [line for line in err if line.startswith("emelex-trace: summarizer 'fake'")]
    assert calls[0].startswith("emelex-trace: summarizer 'fake' -> plugin 'fake' (emelex-fakeplugin 1.2.3): "
                               "(request=SummaryRequest(job=<compaction job ")
    assert "events=<8 items>, budget_tokens=" in calls[0] and "attempt=0" in calls[0]
    assert calls[1].startswith("emelex-trace: summarizer 'fake' <- plugin 'fake' (emelex-fakeplugin 1.2.3): "
                               "returned 'Summary of the events")
    assert any(line.startswith("emelex-trace: distiller 'fake' -> plugin 'fake' (emelex-fakeplugin 1.2.3): "
                               "(request=DistillRequest(job=<distill job ") for line in err)


def test_the_sentences_the_guards_cut_are_counted_in_the_job(env: WorkerSettings, workspace: Path) -> None:
    from emelex_workers.hookspecs import hookimpl
    from emelex_workers.host.manager import PluginInfo, get_plugin_manager
    from emelex_workers.plugin_api import Summarizer
    from emelex_workers.worker.work import Worker

    class Inventing:
        @hookimpl
        def register_summarizers(self, register):
            register(Summarizer("inventing", lambda request: (
                "The user asked question 0? The answer 0 is 0. The answer 1 is 1. The answer 2 is 4. "
                "Zorblax deployed Kubernetes to Jupiter."), needs_model=False))

    pm = get_plugin_manager(env)
    pm.add_plugin(Inventing(), PluginInfo("inventing", "emelex-inventing", "0.1", "test", False))
    with MemoryStore.open(env) as store:
        seed(store, workspace, distill=False)
        report = Worker(store, WorkerSettings(summarizer="inventing"), pm=pm, kinds=("compaction",)).run()
        job = jobs(store)["compaction"]
    assert job.state == "done" and job.result.get("cut_invented", 0) + job.result.get("cut_unsupported", 0) == 1
    assert report.jobs[0].detail == "completed; 1 sentence cut by the faithfulness guards"
    assert "completed; 1 sentence cut by the faithfulness guards" in CliRunner().invoke(
        app, ["memory", "jobs", "list"]).output


def test_which_plugin_wrote_what_survives_an_export_read_back_into_a_fresh_home(env: WorkerSettings, workspace: Path,
                                                                                 tmp_path: Path) -> None:
    """A Summary and a Knowledge version the worker wrote keep their producer through `memory export` and `memory
    import`: the Summary still verifies, and the version still names its distiller."""
    from emelex_workers.interop.export_file import import_export, write_export

    with MemoryStore.open(env) as store:
        sid = seed(store, workspace)
        assert work(store, env).counts["done"] == 2
        write_export(store, str(tmp_path / "export.jsonl"))
    with MemoryStore.open(WorkerSettings(home=tmp_path / "fresh")) as fresh:
        report = import_export(fresh, str(tmp_path / "export.jsonl"))
        assert report.refused == [] and report.imported["sessions"] == 1, report
        summary = fresh.replay(sid).events[0]  # verifies the provenance, the producer included
        assert summary.payload["provenance"]["producer"] == SUMMARIZER
        assert [v.producer for v in fresh.knowledge_history(workspace, "fact-2", 0).versions] == [DISTILLER]


def test_an_export_whose_producer_was_altered_is_refused_and_nothing_of_it_written(env: WorkerSettings,
                                                                                   workspace: Path,
                                                                                   tmp_path: Path) -> None:
    from emelex_workers.interop.export_file import import_export, write_export

    with MemoryStore.open(env) as store:
        seed(store, workspace)
        work(store, env)
        write_export(store, str(tmp_path / "export.jsonl"))
    lines = []
    for line in (tmp_path / "export.jsonl").read_text().splitlines():
        obj = json.loads(line)
        if obj.get("type") == "session":
            obj["summaries"][0]["producer"] = {**SUMMARIZER, "plugin": "other"}
        if obj.get("type") == "knowledge":
            obj["versions"][0]["producer"] = {"plugin": "fake"}  # kind and name missing
        lines.append(json.dumps(obj))
    (tmp_path / "altered.jsonl").write_text("\n".join(lines) + "\n")
    with MemoryStore.open(WorkerSettings(home=tmp_path / "fresh")) as fresh:
        report = import_export(fresh, str(tmp_path / "altered.jsonl"))
        assert report.imported.get("sessions", 0) == 0 and report.imported.get("knowledge", 0) == 0, report
        assert any("provenance differs" in r for r in report.refused), report.refused
        assert any("a producer has the fields" in r for r in report.refused), report.refused
