"""Which turn policy `emelex chat` runs: chosen for the model by default, by `--policy` or the `chat_policy` setting,
said on the chat's first line, recorded in the Session and kept on resume whatever the default became; through the
real `emelex chat` process on the scripted model."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from emelex_memory import MemoryStore
from emelex_memory.agent import journal
from emelex_workers.agent.policies import default_policy
from emelex_workers.settings import WorkerSettings

from ...support.agent import answer
from .test_chat_cli import EMELEX, chat, env  # noqa: F401 - the fixture


def snapshot_of(home: Path):
    with MemoryStore.open(WorkerSettings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        return session.id, journal.stored_snapshot(store, session.id)


def first_line(out: subprocess.CompletedProcess) -> str:
    return out.stdout.splitlines()[0]


def test_a_new_chat_says_which_policy_it_runs_and_why_and_records_it(env, home, workspace, tmp_path) -> None:
    out = chat(env, workspace, "hi\n/exit\n", [answer("Hello! I can read, list and search the files in this "
                                                       "workspace, create a file, or run a command you name.")],
               tmp_path / "effects")
    assert out.returncode == 0, out.stderr
    assert "; policy guided (scripted does not say how many parameters it has); commands: " in first_line(out)
    assert out.stdout.splitlines()[1] == "  guided: answers quote what was read; the files a message names are " \
        "read for the model; a change or a run only when asked for with a verb"
    session, snapshot = snapshot_of(home)
    assert (snapshot.policy, snapshot.protocol) == ({"name": "guided", "version": 3}, "emelex-tools/3")


def test_policy_open_lets_the_model_answer_in_its_own_words(env, home, workspace, tmp_path) -> None:
    words = "The workspace is empty, so there is nothing to read yet. Create a file and I will look at it."
    out = chat(env, workspace, "what is here?\n/exit\n", [answer(words)], tmp_path / "effects", "--policy", "open")
    assert out.returncode == 0, out.stderr
    assert "; policy open (--policy); commands: " in first_line(out)
    assert "tools are called through a constrained JSON grammar" in out.stdout.splitlines()[1]
    assert words in out.stdout
    _, snapshot = snapshot_of(home)
    assert (snapshot.policy, snapshot.protocol, snapshot.chain_limit) == ({"name": "open", "version": 1},
                                                                          "emelex-tools/2", 8)


def test_the_setting_chooses_the_policy_and_a_resume_keeps_the_recorded_one(env, home, workspace, tmp_path) -> None:
    assert chat(env, workspace, "/exit\n", [], tmp_path / "effects").returncode == 0
    session, recorded = snapshot_of(home)
    assert recorded.policy["name"] == "guided"
    later = {**env, "EMELEX_CHAT_POLICY": "open"}  # the default changed since
    resumed = chat(later, workspace, "/exit\n", [], tmp_path / "effects", "--resume", session)
    assert resumed.returncode == 0, resumed.stderr
    assert "; policy guided (recorded in the Session); commands: " in first_line(resumed)
    assert snapshot_of(home)[1] == recorded
    refused = chat(later, workspace, "", [], tmp_path / "effects", "--resume", session, "--policy", "open")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr == (f"error: Session {session} runs turn policy 'guided', as it recorded; resume it without "
                              "--policy (or with --policy guided), or start a new Session with --policy open\n")
    other = tmp_path / "other"
    other.mkdir()
    new = chat(later, other, "/exit\n", [], tmp_path / "effects")
    assert "; policy open (the chat_policy setting); commands: " in first_line(new)


def test_an_unknown_policy_is_refused_before_anything_is_created(env, home, workspace, tmp_path) -> None:
    before = sorted(p.relative_to(home) for p in home.rglob("*"))
    out = chat(env, workspace, "", [], tmp_path / "effects", "--policy", "careful")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr == "error: there is no turn policy named 'careful' (--policy); use one of guided, narrowed, " \
        "open, or 'auto'\n"
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before
    bad = subprocess.run([*EMELEX, "chat", "--workspace", str(workspace)], capture_output=True, text=True,
                         env={**env, "EMELEX_CHAT_POLICY": "Open!"}, timeout=60)
    assert bad.returncode != 0 and "chat_policy" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("kind, parameters, chosen, why", [
    ("local", 134_515_008, "guided", "m has 134.5M parameters, under 1B"),
    ("local", 999_999_999, "guided", "m has 999.9M parameters, under 1B"),
    ("local", 1_000_000_000, "open", "m has 1B parameters, 1B or more"),
    ("local", 7_241_732_096, "open", "m has 7.2B parameters, 1B or more"),
    ("local", None, "guided", "m does not say how many parameters it has"),
    ("served", None, "open", "a served model"),
])
def test_the_default_policy_follows_the_model(kind, parameters, chosen, why) -> None:
    class Model:
        name = "m"

    model = Model()
    model.kind = kind
    assert default_policy(model, parameters) == (chosen, why)
