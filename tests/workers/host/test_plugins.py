"""The plugin framework: hookspecs, entry-point discovery, built-ins, autoload, tracing, broken plugins."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import PluginHookError, PluginLoadError, UnknownPluginComponentError
from emelex_workers import hookspecs
from emelex_workers.cli import app
from emelex_workers.hookspecs import hookimpl
from emelex_workers.models import ModelManager
from emelex_workers.plugin_api import Distiller, ModelCheck, Summarizer
from emelex_workers.host.manager import (
    EmelexPluginManager,
    PluginInfo,
    bind_model,
    check_model,
    choose,
    distillers,
    get_plugin_manager,
    summarizers,
)
from emelex_workers.settings import WorkerSettings

from ...support.plugins import activate, fake_model_file, fake_plugin_distribution, make_distribution

DOCS = Path(__file__).parents[3] / "docs" / "plugins.md"
HOOKS = sorted(name for name, fn in vars(hookspecs).items() if inspect.isfunction(fn) and hasattr(fn, "emelex_spec"))


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch) -> Path:
    """The emelex-fakeplugin distribution, discoverable through importlib.metadata for this test."""
    root = fake_plugin_distribution(tmp_path / "site")
    activate(monkeypatch, root)
    return root


def _pm_with(*plugins: object) -> EmelexPluginManager:
    pm = EmelexPluginManager()
    pm.add_hookspecs(hookspecs)
    for i, plugin in enumerate(plugins):
        pm.add_plugin(plugin, PluginInfo(f"p{i}", "test", "0", "test", False))
    return pm


# -- meta-tests: every hook documented and tested --------------------------------------------------------


def test_there_are_hooks() -> None:
    assert HOOKS == ["check_model", "embedder", "model_binding", "register_distillers", "register_policies",
                     "register_summarizers", "register_tools"]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_states_its_return_contract(hook: str) -> None:
    doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
    assert re.search(r"\breturn", doc, re.IGNORECASE), f"{hook} does not document what it returns"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook: str) -> None:
    signature = f"{hook}{inspect.signature(getattr(hookspecs, hook))}".replace("'", "")
    assert signature in DOCS.read_text(), f"docs/plugins.md lacks `{signature}`"


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook: str) -> None:
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_plugins*.py"))
    assert f"def test_hook_{hook}" in tests


# -- the hooks --------------------------------------------------------------------------------------------


def test_hook_register_tools(settings: WorkerSettings) -> None:
    from emelex_workers.agent.tools import ToolOutput, ToolSpec, registered_tools

    class One:
        @hookimpl
        def register_tools(self, register):
            register(ToolSpec("alpha", "Alpha.", {"type": "object", "properties": {}}, lambda i: ToolOutput("a")))

    pm = get_plugin_manager(settings)
    pm.register(One(), name="one")
    tools = registered_tools(pm)
    assert tools["alpha"].plugin == "one" and "read_file" in tools


def test_hook_register_policies(settings: WorkerSettings) -> None:
    from emelex_workers.agent.policies import registered_policies
    from emelex_workers.plugin_api import TurnPolicy

    class Careful(TurnPolicy):
        name, version, summary = "careful", 3, "reads only"

        def offered(self, turn):
            return [t for t in turn.enabled_tools() if t.approval == "never"]

    class One:
        @hookimpl
        def register_policies(self, register):
            register(Careful())

    pm = get_plugin_manager(settings)
    pm.register(One(), name="one")
    policies = registered_policies(pm)
    assert {"guided", "open", "narrowed"} <= set(policies) and policies["careful"].version == 3

    class Clash:
        @hookimpl
        def register_policies(self, register):
            register(type("Guided", (TurnPolicy,), {"name": "guided"})())

    pm.register(Clash(), name="clash")
    with pytest.raises(PluginHookError, match="'guided' is registered by both 'emelex \\(built-in\\)' and 'clash'"):
        registered_policies(pm)
    pm.unregister(name="clash")

    class Broken:
        @hookimpl
        def register_policies(self, register):
            register("careful")

    pm.register(Broken(), name="broken")
    with pytest.raises(PluginHookError, match="plugin 'broken' registered 'careful', not a TurnPolicy"):
        registered_policies(pm)


def test_hook_register_summarizers() -> None:
    class One:
        @hookimpl
        def register_summarizers(self, register):
            register(Summarizer("alpha", lambda request: "a"))
            register(Summarizer("beta", lambda request: "b"))

    pm = _pm_with(One())
    found = summarizers(pm)
    assert {name: r.plugin for name, r in found.items()} == {"alpha": "p0", "beta": "p0"}
    assert choose(found, "beta", "summarizer").component.summarize(None) == "b"
    with pytest.raises(UnknownPluginComponentError, match="available: alpha, beta"):
        choose(found, "gamma", "summarizer")


def test_hook_register_distillers() -> None:
    class One:
        @hookimpl
        def register_distillers(self, register):
            register(Distiller("facts", lambda request: []))

    class Two:
        @hookimpl
        def register_distillers(self, register):
            register(Distiller("facts", lambda request: []))

    assert list(distillers(_pm_with(One()))) == ["facts"]
    with pytest.raises(PluginHookError, match="'facts' is registered by both 'p1' and 'p0'"):
        distillers(_pm_with(One(), Two()))


def test_hook_model_binding(fake_dist: Path, settings: WorkerSettings, tmp_path: Path) -> None:
    settings = WorkerSettings(home=settings.home, plugins_autoload=True)
    with ModelManager(settings) as manager:
        model = manager.install(fake_model_file(tmp_path / "files"), name="fake")
    pm = get_plugin_manager(settings)
    name, binding = bind_model(pm, model, settings)
    assert name == "fake"  # tryfirst: answers before the built-in llama.cpp binding
    assert binding.context_window == 4096 and binding.model == model

    class Refuses:
        @hookimpl
        def model_binding(self, model):
            return None

    with pytest.raises(UnknownPluginComponentError, match="no plugin can run model 'fake'"):
        bind_model(_pm_with(Refuses()), model, settings)

    class Wrong:
        @hookimpl
        def model_binding(self, model):
            return "not a binding"

    with pytest.raises(PluginHookError, match="plugin 'p0' answered model_binding with a str"):
        bind_model(_pm_with(Wrong()), model, settings)


def test_hook_embedder(settings: WorkerSettings) -> None:
    from emelex_workers.host.types import Embedder
    from emelex_workers.worker.embedding import embedder_of

    class Passes:
        @hookimpl
        def embedder(self, settings):
            return None

    class Embeds:
        @hookimpl
        def embedder(self, settings):
            return Embedder(f"fake:{settings.embedder}", lambda texts: [[1.0, float(len(t))] for t in texts])

    assert embedder_of(settings, _pm_with(Embeds())) is None  # no embedder set: full text alone
    chosen = settings.model_copy(update={"embedder": "mine"})
    assert embedder_of(chosen, _pm_with(Passes(), Embeds())).embed(["ab"]) == [[1.0, 2.0]]
    with pytest.raises(UnknownPluginComponentError, match="no loaded plugin provides the embedder 'mine'"):
        embedder_of(chosen, _pm_with(Passes()))


def test_hook_check_model(settings: WorkerSettings, tmp_path: Path) -> None:
    with ModelManager(settings) as manager:
        model = manager.install(fake_model_file(tmp_path / "files"), name="fake")

    class Passes:
        @hookimpl
        def check_model(self, model):
            return None

    class Checks:
        @hookimpl
        def check_model(self, model, settings):
            return ModelCheck("fake runtime", False, f"{model.name} cannot run here; reinstall it")

    assert check_model(_pm_with(Passes()), model, settings) is None
    assert check_model(_pm_with(Passes(), Checks()), model, settings) == ModelCheck(
        "fake runtime", False, "fake cannot run here; reinstall it")

    class Wrong:
        @hookimpl
        def check_model(self, model):
            return (True, "fine")

    with pytest.raises(PluginHookError, match="plugin 'p0' answered check_model with a tuple, not a ModelCheck"):
        check_model(_pm_with(Wrong()), model, settings)


def test_a_registration_that_is_not_a_component_names_the_plugin() -> None:
    class Bad:
        @hookimpl
        def register_summarizers(self, register):
            register("summarize everything")

    with pytest.raises(PluginHookError, match="plugin 'p0' registered 'summarize everything', not a named Summarizer"):
        summarizers(_pm_with(Bad()))


def test_a_hook_raising_is_attributed_to_its_plugin() -> None:
    class Fine:
        @hookimpl
        def register_summarizers(self, register):
            register(Summarizer("fine", lambda request: "x"))

    class Raises:
        @hookimpl
        def register_summarizers(self, register):
            raise ZeroDivisionError("oops " * 200)

    with pytest.raises(PluginHookError) as info:
        summarizers(_pm_with(Fine(), Raises()))
    message = str(info.value)
    assert message.startswith("plugin 'p1' failed in hook register_summarizers: ZeroDivisionError: oops")
    assert len(message) < 400 and "\n" not in message


# -- loading: entry points, built-ins, autoload, tracing ----------------------------------------------------


def test_entry_point_plugins_and_the_builtin_are_loaded_with_their_distribution(
    fake_dist: Path, settings: WorkerSettings
) -> None:
    pm = get_plugin_manager(settings)
    info = pm.plugin_info
    assert info["fake"] == PluginInfo("fake", "emelex-fakeplugin", "1.2.3", "emelex_fakeplugin", False)
    assert info["llamacpp"].module == "emelex_llamacpp.plugin"
    assert info["llamacpp"].distribution == "emelex-memory" and info["llamacpp"].builtin  # loaded by its entry point
    assert info["tools"].builtin and info["recall"].builtin and info["recall"].module == "emelex_tools.memory"
    assert set(summarizers(pm)) == {"fake", "llamacpp"} and set(distillers(pm)) == {"fake", "llamacpp"}


def test_autoload_off_loads_only_the_builtins(fake_dist: Path, settings: WorkerSettings) -> None:
    pm = get_plugin_manager(WorkerSettings(home=settings.home, plugins_autoload=False))
    assert list(pm.plugin_info) == ["llamacpp", "openai", "tools", "recall"] and pm.plugin_info["llamacpp"].builtin
    assert not pm.has_plugin("fake")


def test_autoload_can_be_turned_off_from_the_environment(
    fake_dist: Path, settings: WorkerSettings, monkeypatch
) -> None:
    monkeypatch.setenv("EMELEX_PLUGINS_AUTOLOAD", "0")
    assert not WorkerSettings(home=settings.home).plugins_autoload


def test_tracing_writes_each_hook_call_to_stderr(fake_dist: Path, settings: WorkerSettings, capsys) -> None:
    pm = get_plugin_manager(WorkerSettings(home=settings.home, plugins_trace=True))
    summarizers(pm)
    err = capsys.readouterr().err
    assert "emelex-trace:" in err and "register_summarizers" in err
    get_plugin_manager(settings)
    summarizers(get_plugin_manager(settings))
    assert "emelex-trace" not in capsys.readouterr().err


def test_a_plugin_failing_to_import_is_named_with_its_distribution(
    tmp_path: Path, monkeypatch, settings: WorkerSettings
) -> None:
    modules = {"emelex_broken": "import no_such_module_x\n"}
    root = make_distribution(tmp_path / "site", "emelex-brokenplugin", "0.9", modules, {"broken": "emelex_broken"})
    activate(monkeypatch, root)
    with pytest.raises(PluginLoadError) as info:
        get_plugin_manager(settings)
    assert str(info.value).startswith(
        "plugin 'broken' from emelex-brokenplugin 0.9 failed to load: ModuleNotFoundError: No module named "
        "'no_such_module_x'; fix or uninstall emelex-brokenplugin, or set EMELEX_PLUGINS_AUTOLOAD=0"
    )
    get_plugin_manager(WorkerSettings(home=settings.home, plugins_autoload=False))  # the way out works


def test_a_plugin_implementing_an_unknown_hook_is_refused_by_name(
    tmp_path: Path, monkeypatch, settings: WorkerSettings
) -> None:
    source = "from emelex_workers.hookspecs import hookimpl\n\n@hookimpl\ndef summarise_everything():\n    pass\n"
    activate(monkeypatch, make_distribution(tmp_path / "site", "emelex-typo", "2.0", {"emelex_broken_typo": source},
                                            {"typo": "emelex_broken_typo"}))
    with pytest.raises(PluginLoadError, match=r"plugin 'typo' from emelex-typo 2.0 failed to load: .*summarise_"):
        get_plugin_manager(settings)


def test_a_plugin_with_a_bad_hook_signature_is_refused_by_name(
    tmp_path: Path, monkeypatch, settings: WorkerSettings
) -> None:
    source = "from emelex_workers.hookspecs import hookimpl\n\n@hookimpl\ndef model_binding(model, gpu):\n    pass\n"
    activate(monkeypatch, make_distribution(tmp_path / "site", "emelex-sig", "1.0", {"emelex_broken_sig": source},
                                            {"sig": "emelex_broken_sig"}))
    with pytest.raises(PluginLoadError, match=r"plugin 'sig' from emelex-sig 1.0 failed to load: .*gpu"):
        get_plugin_manager(settings)


# -- the CLI ---------------------------------------------------------------------------------------------------


@pytest.fixture
def cli_home(home: Path, monkeypatch) -> Path:
    monkeypatch.setenv("EMELEX_HOME", str(home))
    return home


def test_plugins_list_shows_each_plugin_and_its_distribution(fake_dist: Path, cli_home: Path) -> None:
    result = CliRunner().invoke(app, ["plugins", "list"])
    assert result.exit_code == 0, result.output
    assert "fake  from emelex-fakeplugin 1.2.3  [emelex_fakeplugin]" in result.output
    assert re.search(r"llamacpp  from emelex-memory \S+ \(built-in\)  \[emelex_llamacpp.plugin\]", result.output)
    data = json.loads(CliRunner().invoke(app, ["plugins", "list", "--json"]).output)
    fake = next(p for p in data["plugins"] if p["name"] == "fake")
    assert {p["name"]: p["builtin"] for p in data["plugins"]} == {"fake": False, "llamacpp": True, "openai": True, "tools": True,
                                                                 "recall": True}
    assert fake["summarizers"] == ["fake"] and fake["distillers"] == ["fake"] and fake["binds_models"]
    assert fake["hooks"] == ["model_binding", "register_distillers", "register_summarizers"]


def test_a_broken_plugin_is_one_line_in_the_cli(tmp_path: Path, monkeypatch, cli_home: Path) -> None:
    modules = {"emelex_broken": "raise RuntimeError('kaputt')\n"}
    activate(monkeypatch, make_distribution(tmp_path / "site", "emelex-brokenplugin", "0.9", modules,
                                            {"broken": "emelex_broken"}))
    result = CliRunner().invoke(app, ["plugins", "list"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert result.output.startswith(
        "error: plugin 'broken' from emelex-brokenplugin 0.9 failed to load: RuntimeError: kaputt"
    )


def test_the_builtin_binding_does_not_import_llama_cpp(tmp_path: Path) -> None:
    """Commands that run no inference start without llama.cpp: binding is lazy."""
    code = (
        "import sys; from pathlib import Path\n"
        "from emelex_workers.settings import WorkerSettings\n"
        "from emelex_workers.models import ModelManager\n"
        "from emelex_workers.host.manager import bind_model, get_plugin_manager\n"
        f"s = WorkerSettings(home={str(tmp_path / 'home')!r}, plugins_autoload=False)\n"
        "p = Path(s.home.parent / 'm.gguf'); p.write_bytes(b'GGUF' + bytes(64))\n"
        "m = ModelManager(s).install(p, name='m')\n"
        "name, b = bind_model(get_plugin_manager(s), m, s)\n"
        "print(name, type(b).__name__, 'llama_cpp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["llamacpp", "LlamaBinding", "False"]


def test_the_documented_third_party_plugin_works(tmp_path: Path, monkeypatch, home: Path, workspace: Path) -> None:
    """The example in docs/plugins.md, installed as written, summarizes a real compaction job."""
    from emelex_memory import MemoryStore, NewEvent
    from emelex_workers.worker.work import work

    text = DOCS.read_text()
    source = re.search(r"`emelex_firstline.py`.*?```python\n(.*?)```", text, re.S).group(1)
    assert 'firstline = "emelex_firstline"' in text
    activate(monkeypatch, make_distribution(tmp_path / "site", "emelex-firstline", "0.1.0",
                                            {"emelex_firstline": source}, {"firstline": "emelex_firstline"}))
    activate(monkeypatch, fake_plugin_distribution(tmp_path / "site2"))
    settings = WorkerSettings(home=home, default_model="fake", summarizer="firstline", distiller="fake")
    ModelManager(settings).install(fake_model_file(tmp_path / "files"), name="fake")
    with MemoryStore.open(settings) as store:
        session = store.create_session(workspace)
        with store.acquire_lease(session.id, workspace) as lease:
            list(lease.replay_all())
            for i in range(6):
                lease.append_turn([NewEvent("user", {"text": f"q{i}"}), NewEvent("assistant", {"text": f"a{i}"})])
            lease.release()
        store.queue_compaction(session.id, context_window=4096, force=True)
        assert work(store, settings).counts["done"] == 1
        summary = store.replay(session.id).events[0]
    assert summary.payload["text"] == "Earlier the user asked: user: q0 / user: q1"


def test_doctor_fails_the_model_check_when_a_plugin_crashes_in_check_model(
        tmp_path: Path, monkeypatch, home: Path) -> None:
    """docs/plugins.md: a plugin that raises in `check_model` is a failed check, not a healthy "not checked"."""
    from emelex_memory import MemoryStore

    source = ("from emelex_workers.hookspecs import hookimpl\n\n\n@hookimpl(tryfirst=True)\n"
              "def check_model(model, settings):\n    raise RuntimeError('the probe crashed')\n")
    activate(monkeypatch, make_distribution(tmp_path / "site", "emelex-crashcheck", "0.1", {"emelex_broken_check": source},
                                            {"crashcheck": "emelex_broken_check"}))
    monkeypatch.setenv("EMELEX_HOME", str(home))
    monkeypatch.setenv("EMELEX_DEFAULT_MODEL", "fake")
    ModelManager(WorkerSettings(home=home)).install(fake_model_file(tmp_path / "files"), name="fake")
    MemoryStore.open(WorkerSettings(home=home)).close()
    result = CliRunner().invoke(app, ["memory", "doctor"])
    assert result.exit_code == 1, result.output
    assert ("[FAIL] model: plugin 'crashcheck' failed in hook check_model: RuntimeError: the probe crashed"
            in result.output)
