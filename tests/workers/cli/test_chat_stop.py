"""`emelex chat` on the embedded default model (real llama.cpp in a real process, on a pseudo-terminal), stopped while
the model works: Ctrl-C (SIGINT) or SIGTERM while the model file is loading ends the chat with 128+N, says so at once
and creates no Session; Ctrl-C while the model evaluates a long prompt interrupts the turn there (the failure record
says how far the prompt's evaluation got) and the chat goes on; SIGTERM then ends the chat. Nothing prints a
traceback, nor llama-cpp-python's "Exception ignored on calling ctypes callback function"."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, Settings
from emelex_workers.models import ModelManager
from tests.support.models import remember_probe_pass, require_default_model

require_default_model()

EMELEX = [sys.executable, "-c", "from emelex_workers.cli import main; main()"]
DEADLINE_S = 240.0
LONG = " ".join(f"Line {n}: the exporter writes batch {n} to notes/{n}.md after the cache is checked." for n in range(60))


@pytest.fixture
def chat_env(home: Path) -> dict[str, str]:
    settings = Settings(home=home, plugins_autoload=False)
    with ModelManager(settings) as manager:
        model = manager.install_default(link=True)
    remember_probe_pass(home, model)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMELEX_")}
    env.update(EMELEX_HOME=str(home), EMELEX_PLUGINS_AUTOLOAD="0", TERM="xterm-256color")
    return env, model.model_file


class Chat:
    """`emelex chat` with standard input and output on a pseudo-terminal and standard error on a pipe."""

    def __init__(self, env: dict[str, str], workspace: Path) -> None:
        master, slave = pty.openpty()
        self.proc = subprocess.Popen([*EMELEX, "chat", "--workspace", str(workspace)], stdin=slave, stdout=slave,
                                     stderr=subprocess.PIPE, env=env, close_fds=True)
        os.close(slave)
        self.master, self.output = master, ""

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:
            return False
        self.output += data.decode("utf-8", "replace")
        return bool(data)

    def wait_for(self, seen) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not seen():
            assert self.proc.poll() is None, f"the chat ended first:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"never seen in {DEADLINE_S} s:\n{self.output[-3000:]}"
            self._read(0.005)

    def expect(self, text: str) -> None:
        self.wait_for(lambda: text in self.output)

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def finish(self) -> tuple[int, str, str]:
        deadline = time.monotonic() + DEADLINE_S
        while self._read(0.2):
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"the chat did not end in {DEADLINE_S} s:\n{self.output[-3000:]}")
        os.close(self.master)
        status = self.proc.wait(timeout=DEADLINE_S)
        return status, self.output, self.proc.stderr.read().decode("utf-8", "replace")


def _mapped(pid: int, model_file: Path) -> bool:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return str(model_file) in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_chat_loads_its_model_ends_it_and_creates_no_session(
    signum: int, chat_env, home: Path, workspace: Path
) -> None:
    env, model_file = chat_env
    chat = Chat(env, workspace)
    chat.wait_for(lambda: _mapped(chat.proc.pid, model_file))
    chat.proc.send_signal(signum)
    status, output, err = chat.finish()
    name = signal.Signals(signum).name
    assert status == 128 + signum, err
    assert f"stopping ({name}): the chat ends once the model stops starting" in err
    assert f"chat stopped by {name}: the chat stopped while loading the model; nothing of its Session was changed" \
        in err, err
    assert "Traceback" not in err + output and "Exception ignored" not in err + output
    with MemoryStore.open(Settings(home=home)) as store:
        assert store.list_sessions().sessions == []


def test_ctrl_c_while_the_model_reads_a_long_prompt_interrupts_the_turn_there(
    chat_env, home: Path, workspace: Path
) -> None:
    env, _ = chat_env
    chat = Chat(env, workspace)
    chat.expect("; commands:")
    chat.type(f"Please summarize these notes. {LONG}")
    chat.expect("reading the prompt, ")  # the status line while the prompt is evaluated
    chat.proc.send_signal(signal.SIGINT)
    chat.expect("interrupting the turn")
    chat.expect("[turn interrupted: the turn was interrupted while evaluating the prompt (")
    chat.proc.send_signal(signal.SIGTERM)
    status, output, err = chat.finish()
    assert status == 143, err
    assert "Traceback" not in err + output and "Exception ignored" not in err + output
    with MemoryStore.open(Settings(home=home)) as store:
        (session,) = store.list_sessions().sessions
        failed = [e.payload for e in store.replay(session.id).events if e.kind == "turn_failed"]
    assert [f["reason"] for f in failed] == ["interrupted"]
    done, total = failed[0]["diagnostic"].rsplit("(", 1)[1].split(" tokens)")[0].split(" of ")
    assert int(done) < int(total)  # stopped inside the prompt, not at the first token after it
