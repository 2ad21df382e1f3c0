"""run_command: one shell command in the workspace, bounded in time and output.

The command runs with `/bin/sh -c` in the workspace directory, in its own
process group, with no stdin. After `TIMEOUT_S` the whole group is killed.
Its shell may outlive the chat (killed, or left at a second Ctrl-C), so it is
recorded in the journal (`ToolInvocation.track_process`: process group, start
time, boot) before the command runs: the shell starts waiting for one line on
a pipe and runs the command only once it reads "go", which is written after
the record was committed. A chat that dies before that closes the pipe, and
the shell exits without running anything.
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
# The shell that runs a command: it waits for "go" on its stdin (the tool writes it once the shell is recorded),
# then runs the command in place (same pid, group and start time) with stdin from /dev/null; anything else (the
# pipe closed by a chat that died) ends it with status 125 and nothing run.
GATE = 'IFS= read -r go; exec </dev/null; [ "$go" = go ] || exit 125; exec /bin/sh -c "$1"'


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_command(invocation: ToolInvocation, timeout_s: float = TIMEOUT_S) -> ToolOutput:
    """Run `command`; the output is "exit code N" (or "timed out after T s") and the combined output; an error
    output when the command failed or timed out, or its process could not be recorded (then it never ran)."""
    command = invocation.arguments["command"]
    process = subprocess.Popen(["/bin/sh", "-c", GATE, "emelex-run-command", command], cwd=invocation.workspace,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        invocation.track_process(process.pid, command)
    except BaseException as exc:
        process.stdin.close()  # the shell reads no "go": it exits without running the command
        _kill_group(process)
        process.wait()
        if not isinstance(exc, Exception):
            raise
        return ToolOutput(f"not run: its process could not be recorded ({type(exc).__name__}: {exc})", is_error=True)
    process.stdin.write(b"go\n")
    process.stdin.close()
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
