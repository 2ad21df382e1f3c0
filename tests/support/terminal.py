"""A program on a pseudo-terminal, for the tests that stop it while it works: what it shows is read as it comes, and
every wait has a deadline."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from pathlib import Path

DEADLINE_S = 240.0  # the longest wait for any one thing it shows (the machine is shared; inference is slow)


class Terminal:
    """`args` on a 160-column pseudo-terminal: stdin and stdout, and stderr too unless `stderr` is given (e.g.
    `subprocess.PIPE`); extra `options` go to `subprocess.Popen` (e.g. `start_new_session=True`)."""

    def __init__(self, args: list[str], env: dict[str, str], *, stderr=None, **options) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave if stderr is None else stderr,
                                     env=env, close_fds=True, **options)
        os.close(slave)
        self.master, self.output = master, ""

    def read(self, timeout: float) -> bool:
        """Read what arrives within `timeout` seconds; False once the terminal is closed (the program ended)."""
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the last writer is gone
            return False
        self.output += data.decode("utf-8", "replace")
        return bool(data)

    def wait_for(self, seen: Callable[[], object], *, ended_ok: bool = False) -> None:
        """Read until `seen()` is true (at most `DEADLINE_S`); the program may end first only when `ended_ok`."""
        deadline = time.monotonic() + DEADLINE_S
        while not seen():
            if ended_ok and self.proc.poll() is not None:
                return
            assert self.proc.poll() is None, f"it ended first:\n{self.output[-3000:]}"
            assert time.monotonic() < deadline, f"never seen in {DEADLINE_S} s:\n{self.output[-3000:]}"
            self.read(0.005)

    def expect(self, text: str) -> None:
        """Read until the output holds `text`."""
        self.wait_for(lambda: text in self.output)

    def type(self, line: str) -> None:
        """Type `line` and Enter."""
        os.write(self.master, (line + "\n").encode())

    def finish(self) -> tuple[int, str]:
        """Read to the end; the exit status and everything shown."""
        deadline = time.monotonic() + DEADLINE_S
        while self.read(0.2):
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"it did not end in {DEADLINE_S} s:\n{self.output[-3000:]}")
        os.close(self.master)
        return self.proc.wait(timeout=DEADLINE_S), self.output


def mapped(pid: int, path: Path) -> bool:
    """Whether process `pid` has `path` mapped (llama.cpp maps a model file as it starts loading it)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            return str(path) in f.read()
    except OSError:
        return False
