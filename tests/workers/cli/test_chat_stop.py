"""`emelex chat` on the embedded default model (real llama.cpp in a real process, on a pseudo-terminal), stopped while
the model works: Ctrl-C (SIGINT) or SIGTERM while the model file is loading ends the chat with 128+N, says so at once
and creates no Session; Ctrl-C while the model evaluates a long prompt interrupts the turn there (the failure record
says how far the prompt's evaluation got) and the chat goes on; SIGTERM then ends the chat. Nothing prints a
traceback, nor llama-cpp-python's "Exception ignored on calling ctypes callback function"."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, Settings
from emelex_workers.settings import WorkerSettings
from emelex_workers.models import ModelManager
from tests.support.models import remember_probe_pass, require_default_model
from tests.support.terminal import Terminal, mapped

require_default_model()

EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
LONG = " ".join(f"Line {n}: the exporter writes batch {n} to notes/{n}.md after the cache is checked." for n in range(60))


@pytest.fixture
def chat_env(home: Path) -> dict[str, str]:
    settings = WorkerSettings(home=home, plugins_autoload=False)
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    remember_probe_pass(home, model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env.update(EMELEX_HOME=str(home), EMELEX_PLUGINS_AUTOLOAD="0", TERM="xterm-256color")
    return env, model.model_file


def _chat(env: dict[str, str], workspace: Path) -> Terminal:
    """`emelex chat` with standard input and output on a pseudo-terminal and standard error on a pipe."""
    return Terminal([*EMELEX, "chat", "--workspace", str(workspace)], env, stderr=subprocess.PIPE)


def _finish(chat: Terminal) -> tuple[int, str, str]:
    status, output = chat.finish()
    return status, output, chat.proc.stderr.read().decode("utf-8", "replace")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_chat_loads_its_model_ends_it_and_creates_no_session(
    signum: int, chat_env, home: Path, workspace: Path
) -> None:
    env, model_file = chat_env
    chat = _chat(env, workspace)
    chat.wait_for(lambda: mapped(chat.proc.pid, model_file))
    chat.proc.send_signal(signum)
    status, output, err = _finish(chat)
    name = signal.Signals(signum).name
    assert status == 128 + signum, err
    assert f"stopping ({name}): the chat ends once the model stops starting" in err
    # The model file is mapped as its loading begins; the rest of a cached 100 MB file loads in milliseconds, so the
    # signal may land just after (the load's own abort is proven in test_engine_stop.py): stopped either way.
    assert re.search(f"chat stopped by {name}: the chat stopped (while loading the model|once the model was loaded); "
                     "nothing of its Session was changed", err), err
    assert "Traceback" not in err + output and "Exception ignored" not in err + output
    with MemoryStore.open(Settings(home=home)) as store:
        assert store.list_sessions().sessions == []


def test_ctrl_c_while_the_model_reads_a_long_prompt_interrupts_the_turn_there(
    chat_env, home: Path, workspace: Path
) -> None:
    env, _ = chat_env
    chat = _chat(env, workspace)
    chat.expect("; commands:")
    chat.type(f"Please summarize these notes. {LONG}")
    chat.expect("reading the prompt, ")  # the status line while the prompt is evaluated
    chat.proc.send_signal(signal.SIGINT)
    chat.expect("interrupting the turn")
    chat.wait_for(lambda: re.search(r"\[turn interrupted: [^\]]*\]", chat.output))
    assert "[turn interrupted: the turn was interrupted while evaluating the prompt (" in chat.output
    chat.proc.send_signal(signal.SIGTERM)
    status, output, err = _finish(chat)
    assert status == 143, err
    assert "Traceback" not in err + output and "Exception ignored" not in err + output
    with MemoryStore.open(Settings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        failed = [e.payload for e in store.replay(session.id).events if e.kind == "turn_failed"]
    assert [f["reason"] for f in failed] == ["interrupted"]
    done, total = failed[0]["diagnostic"].rsplit("(", 1)[1].split(" tokens)")[0].split(" of ")
    assert int(done) < int(total)  # stopped inside the prompt, not at the first token after it
