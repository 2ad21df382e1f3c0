"""Settings catch typos: config.toml's unknown keys and `home` are refused with the file, the line and the nearest
setting; `emelex config show` says where every value came from; a mistyped EMELEX_* variable is warned about."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emelex_memory import MemoryStore, Settings, SettingsFileError
from emelex_workers.cli import app
from emelex_workers.settings import WorkerSettings

from ..support import file_state
from ..workers.cli.test_cli_conventions import _runner

runner = CliRunner()


@pytest.fixture(autouse=True)
def env_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    for key in list(os.environ):
        if key.upper().startswith("EMELEX_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("EMELEX_HOME", str(home))
    home.mkdir(mode=0o700)
    return home


def _config(home: Path, text: str) -> Path:
    path = home / "config.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_a_mistyped_key_names_the_file_the_line_and_the_nearest_setting(home: Path) -> None:
    path = _config(home, "# retention\nbusy_timeout_ms = 100\n\nsesion_retention_days = 7\n")
    with pytest.raises(SettingsFileError) as info:
        Settings()
    assert str(info.value) == (f"{path} line 4: unknown setting 'sesion_retention_days'; did you mean "
                               "'session_retention_days'? (fix or remove the line)")


def test_the_cli_refuses_a_mistyped_key_in_one_line_and_changes_nothing(home: Path, workspace: Path) -> None:
    MemoryStore.open(Settings()).close()
    path = _config(home, 'default_modle = "x"\n')
    before = file_state(home)
    result = runner.invoke(app, ["memory", "sessions", "list"])
    assert result.exit_code == 1
    assert result.output == (f"error: {path} line 1: unknown setting 'default_modle'; did you mean 'default_model'? "
                             "(fix or remove the line)\n")
    assert file_state(home) == before


def test_the_workers_keys_are_read_by_their_class_and_are_no_unknown_setting_to_the_core(home: Path) -> None:
    path = _config(home, 'busy_timeout_ms = 100\ndefault_model = "my-model"\nsummary_mode = "abstractive"\n')
    core = Settings()
    assert core.busy_timeout_ms == 100 and not hasattr(core, "default_model")
    workers = WorkerSettings()
    assert (workers.busy_timeout_ms, workers.default_model, workers.summary_mode) == (100, "my-model", "abstractive")
    _config(home, 'default_modle = "x"\n')
    for settings_class in (Settings, WorkerSettings):  # a typo of either layer's key is refused by both
        with pytest.raises(SettingsFileError) as info:
            settings_class()
        assert str(info.value) == (f"{path} line 1: unknown setting 'default_modle'; did you mean 'default_model'? "
                                   "(fix or remove the line)")


@pytest.mark.parametrize("text, line, said", [
    ("busy_timeout_ms = 1\n\n[sessions]\nretention = 3\n", 3, "'sessions' is a table"),  # no setting is one
    ('busy_timeout_ms = 1\n"quoted key" = 2\n', 2, "unknown setting 'quoted key'; remove the line, then "
                                                   "`emelex config show` lists every setting"),
    ("a.b = 1\n", 1, "'a' is a table ([a] or a dotted key a.NAME), and config.toml takes only top-level settings"),
])
def test_no_key_is_silently_ignored(home: Path, text: str, line: int, said: str) -> None:
    path = _config(home, text)
    with pytest.raises(SettingsFileError) as info:
        Settings()
    assert str(info.value).startswith(f"{path} line {line}: {said}")


def test_home_in_config_toml_is_refused_with_why(home: Path, tmp_path: Path) -> None:
    path = _config(home, f'busy_timeout_ms = 100\nhome = "{tmp_path / "elsewhere"}"\n')
    with pytest.raises(SettingsFileError) as info:
        Settings()
    assert str(info.value) == (f"{path} line 2: 'home' cannot be set in config.toml, which is read from the Home it "
                               "would choose; set EMELEX_HOME (or pass home=) instead and remove the line")
    assert not (tmp_path / "elsewhere").exists()


def test_an_invalid_value_names_where_it_came_from(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(home, "busy_timeout_ms = 100\nmodel_threads = 0\n")
    result = runner.invoke(app, ["memory", "sessions", "list"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: invalid setting model_threads (from {path} line 2): ")
    monkeypatch.setenv("EMELEX_MODEL_THREADS", "-1")
    result = runner.invoke(app, ["memory", "sessions", "list"])
    assert result.output.startswith("error: invalid setting model_threads (from EMELEX_MODEL_THREADS): ")


def test_every_key_of_the_example_file_is_a_setting(home: Path) -> None:
    example = Path(__file__).parents[2] / "config" / "emelex.toml.example"
    _config(home, example.read_text())
    assert Settings().busy_timeout_ms == 5000


def test_config_show_says_where_each_value_came_from(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(home, "# a comment\nsession_retention_days = 7\nmodel_threads = 3\n")
    monkeypatch.setenv("EMELEX_MODEL_THREADS", "1")  # the environment wins over the file
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split(None, 2)[1:] for line in result.output.splitlines()}
    assert lines["session_retention_days"] == ["7.0", f"file {path} line 2"]
    assert lines["model_threads"] == ["1", "environment EMELEX_MODEL_THREADS"]
    assert lines["busy_timeout_ms"] == ["5000", "default"]
    assert lines["home"] == [str(home), "environment EMELEX_HOME"]
    data = json.loads(runner.invoke(app, ["config", "show", "--json"]).output)
    assert data["outcome"] == "shown" and data["config_file"] == str(path)
    shown = {s["name"]: s for s in data["settings"]}
    assert shown["session_retention_days"] == {"name": "session_retention_days", "value": 7.0, "source": "file",
                                               "where": f"{path} line 2"}
    assert shown["model_threads"]["source"] == "environment" and shown["busy_timeout_ms"]["source"] == "default"
    assert set(shown) == set(WorkerSettings.model_fields)  # the core's settings and the workers'
    assert set(Settings.model_fields) < set(WorkerSettings.model_fields)


def test_a_mistyped_variable_is_warned_about_with_the_nearest_name(monkeypatch: pytest.MonkeyPatch) -> None:
    MemoryStore.open(Settings()).close()
    monkeypatch.setenv("EMELEX_SESION_RETENTION_DAYS", "7")
    monkeypatch.setenv("EMELEX_SOMETHING_ELSE", "1")  # another tool's: not near any setting, not warned about
    result = _runner().invoke(app, ["memory", "sessions", "list"])
    assert result.exit_code == 0
    assert result.stderr == ("warning: EMELEX_SESION_RETENTION_DAYS is not a setting and is ignored; did you mean "
                             "EMELEX_SESSION_RETENTION_DAYS?\n")
    shown = _runner().invoke(app, ["config", "show"])
    assert shown.stderr == ""  # config show lists the variable itself, once
    assert "EMELEX_SESION_RETENTION_DAYS: not a setting, ignored; did you mean EMELEX_SESSION_RETENTION_DAYS?" in (
        shown.stdout)
    data = json.loads(runner.invoke(app, ["config", "show", "--json"]).stdout)
    assert data["unknown_environment"] == [
        {"name": "EMELEX_SESION_RETENTION_DAYS", "nearest": "EMELEX_SESSION_RETENTION_DAYS"},
        {"name": "EMELEX_SOMETHING_ELSE", "nearest": None},
    ]


def test_config_show_says_an_unset_model_threads_is_chosen_when_work_starts(home: Path) -> None:
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("model_threads ")]
    assert line.split(None, 1)[1].startswith("unset (chosen when work starts)") and "None" not in line
    data = json.loads(runner.invoke(app, ["config", "show", "--json"]).output)
    assert {s["name"]: s["value"] for s in data["settings"]}["model_threads"] is None
