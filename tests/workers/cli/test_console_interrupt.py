"""A Ctrl-C while `emelex` still imports its command line ends it with one line and status 130, never a traceback:
a real process, held inside the import of `emelex_workers.cli` until the test has sent it a real SIGINT, so the
signal lands in the import whatever the machine's speed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

HELD_IMPORT = """
import importlib.abc, pathlib, sys, time
marker = pathlib.Path(sys.argv[1])

class Hold(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "emelex_workers.cli":
            marker.write_text("importing")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                time.sleep(0.05)
        return None

sys.meta_path.insert(0, Hold())
sys.argv = ["emelex", "--help"]
from emelex_workers.console import main
main()
"""


def test_a_ctrl_c_while_the_command_line_is_imported_is_one_line_and_status_130(tmp_path: Path) -> None:
    marker = tmp_path / "importing"
    process = subprocess.Popen([sys.executable, "-c", HELD_IMPORT, str(marker)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline, "the command never reached its import"
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.strip() == "emelex: interrupted"
    assert stdout == ""
