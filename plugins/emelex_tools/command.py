"""run_command: one shell command in the workspace, bounded in time and output.

The command runs with `/bin/sh -c` in the workspace directory, in its own
process group, with no stdin. After `TIMEOUT_S` the whole group is killed.
Standard output and error are read together; the first `OUTPUT_CAP` bytes
are kept and the rest counted. The command runs with the user's own
permissions: the working directory is the workspace, but nothing stops a
command from touching other files, which is why every call needs approval.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from emelex_workers.plugin_api import ToolInvocation, ToolOutput

TIMEOUT_S = 60
OUTPUT_CAP = 256 * 1024
DRAIN_S = 5  # how long to wait for the pipe to close after the command ended


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_command(invocation: ToolInvocation, timeout_s: float = TIMEOUT_S) -> ToolOutput:
    """Run `command`; the output is "exit code N" (or "timed out after T s") and the combined output; an error
    output when the command failed or timed out."""
    command = invocation.arguments["command"]
    process = subprocess.Popen(["/bin/sh", "-c", command], cwd=invocation.workspace, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    kept: list[bytes] = []
    total = [0]

    def drain() -> None:
        assert process.stdout is not None
        while chunk := process.stdout.read1(65536):
            room = OUTPUT_CAP - sum(map(len, kept))
            if room > 0:
                kept.append(chunk[:room])
            total[0] += len(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process)  # also ends what the command left running in its group
        process.wait()
    reader.join(DRAIN_S)
    output = b"".join(kept).decode("utf-8", "replace")
    if total[0] > OUTPUT_CAP:
        output += f"\n[run_command: kept the first {OUTPUT_CAP} of {total[0]} bytes of output]"
    status = f"timed out after {timeout_s} s" if timed_out else f"exit code {process.returncode}"
    return ToolOutput(f"{status}\n{output}", is_error=timed_out or process.returncode != 0)
