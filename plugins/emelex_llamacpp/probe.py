"""Does llama.cpp run on this CPU? One short multi-token generation in a child process.

A llama-cpp-python wheel built for another CPU (native instructions such as AVX-512 or AMX) loads and
tokenizes fine and dies with SIGILL on the first prompt longer than one token. Running that generation in a
child process turns such a crash into a one-line answer naming the rebuild command, instead of a silent exit
of the worker or the chat. Importing this module does not import llama_cpp.

`ensure_generates` is the guard the plugin's binding runs before it first loads a model in a process (the worker
and the chat both load through it): the probe runs once per llama.cpp build, model file and CPU, and a pass is
remembered for the process and, as an empty marker file `<Home>/cache/llama-probe-<key>`, for later processes.
The key hashes the llama_cpp package's shared libraries (name, size, mtime), the model file (path, size, mtime),
the Python executable and the CPU's identity (its model name and flags on Linux), so a rebuilt wheel, another
model or a CPU that changed under the virtual machine is probed again. (A probe costs a model load and a few
tokens in a child, a second or so; the marker keeps it off every cron run of the worker.) A crash raises `LlamaCrashError`; a probe
that fails otherwise (say, a timeout on a very busy machine) is not remembered and stops nothing.

`python -m emelex_llamacpp.probe MODEL.gguf` prints the answer and exits 0 when the generation ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from emelex_memory import ModelError
from emelex_workers.plugin_api import GenerationInterrupted

REBUILD = "make rebuild-llama"
PROBE_TIMEOUT_S = 120.0

# Loads the model with a small window and generates a few tokens from a prompt of several tokens, the path
# that runs the matrix kernels a mismatched build crashes in.
_CHILD = """
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, n_threads_batch=1, seed=1, verbose=False)
out = llm.create_completion("The three primary colours are red, yellow and", max_tokens=8, temperature=0.0)
print(out["usage"]["completion_tokens"])
"""


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found: `ok` when the child generated, else `problem`, one line saying what to do;
    `crashed` when the child was killed by a signal (the build does not fit this CPU)."""

    ok: bool
    problem: str = ""
    generated_tokens: int = 0
    crashed: bool = False


class LlamaCrashError(ModelError):
    """llama.cpp crashed generating on this CPU (its build does not fit the machine): rebuild it with
    `make rebuild-llama`, then run the command again."""


CRASH_SIGNALS = frozenset({signal.SIGILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT,
                           signal.SIGSYS})  # what a build that does not fit the CPU dies of
POLL_S = 0.05  # how often a probe's wait looks at its stop event


def run_probe(model_file: str | Path, *, timeout_s: float = PROBE_TIMEOUT_S,
              stop: threading.Event | None = None) -> ProbeResult:
    """Generate a few tokens with `model_file` in a child Python; never raises for what the child does.

    A child killed by a crash signal (SIGILL, SIGSEGV, ...) means the llama.cpp build does not fit this CPU:
    the problem names the signal and `make rebuild-llama`. A child that fails otherwise (killed by SIGINT or
    SIGTERM too: a Ctrl-C at the terminal reaches it), or runs past `timeout_s`, is reported with its last line
    of output. Once `stop` is set the child is killed and `GenerationInterrupted` raised.
    """
    try:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(model_file)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        return ProbeResult(False, f"could not start a probe process ({exc.strerror or exc})")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if stop is not None and stop.is_set():
                raise GenerationInterrupted("while checking that llama.cpp runs on this CPU")
            try:
                out, err = child.communicate(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    return ProbeResult(False, f"a llama.cpp probe generation ran past {timeout_s:.0f} s (is the "
                                              "machine very busy?); run it again when it is quieter")
    finally:
        if child.returncode is None:
            child.kill()
            child.communicate()
    if stop is not None and stop.is_set():  # the stop came while the child ran (a Ctrl-C may have ended it too)
        raise GenerationInterrupted("while checking that llama.cpp runs on this CPU")
    if child.returncode < 0 and -child.returncode in CRASH_SIGNALS:
        name = signal.Signals(-child.returncode).name
        return ProbeResult(False, f"llama.cpp crashed ({name}) generating on this CPU: its build does not fit "
                                  f"this machine; rebuild it with `{REBUILD}`", crashed=True)
    if child.returncode != 0:
        last = (err.strip().splitlines() or [f"it ended with status {child.returncode}"])[-1]
        return ProbeResult(False, f"a llama.cpp probe generation failed: {last}")
    try:
        generated = int(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return ProbeResult(False, "a llama.cpp probe generation printed no token count")
    return ProbeResult(True, generated_tokens=generated)


_PASSED: set[str] = set()  # probe keys that generated, in this process


def probe_key(model_file: str | Path, model_digest: str | None = None) -> str:
    """What a probe's answer depends on, hashed: the llama_cpp build (its shared libraries), the model (its
    `model_digest`, the installed snapshot's content digest, when given: every copy of the same bytes is the same
    model; else the file's path, size and mtime), the Python executable and the CPU (see the module docstring).
    Raises `OSError` when the model file is missing."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    libraries = []
    if spec is not None and spec.origin:
        folder = Path(spec.origin).parent / "lib"
        for entry in sorted(folder.iterdir()) if folder.is_dir() else ():
            st = entry.stat()
            libraries.append([entry.name, st.st_size, st.st_mtime_ns])
    st = os.stat(model_file)
    model = model_digest or [str(Path(model_file).resolve()), st.st_size, st.st_mtime_ns]
    identity = [libraries, model, sys.executable, _cpu_identity()]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]


def _cpu_identity() -> list[str]:
    """The CPU's model name and feature flags (Linux's /proc/cpuinfo, first CPU), else the platform's words."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            fields = dict(line.split(":", 1) for line in f.read(1 << 16).split("\n\n")[0].splitlines()
                          if ":" in line)
    except OSError:
        fields = {}
    found = {k.strip(): v.strip() for k, v in fields.items()}
    return [found.get("model name", platform.processor()), found.get("flags", found.get("Features", "")),
            platform.machine()]


def ensure_generates(model_file: str | Path, home: Path | None = None, *, model_digest: str | None = None,
                     stop: threading.Event | None = None) -> None:
    """Make sure llama.cpp generates with `model_file` on this CPU before a process loads it; once per process,
    and once per build, model and CPU when `home` (Emelex Home) is given to remember a pass in (`model_digest`:
    see `probe_key`).

    Raises `LlamaCrashError` (one line naming `make rebuild-llama`) when the probe child died of a crash signal,
    and `GenerationInterrupted` when `stop` was set during the probe (which then stops there). A probe that fails
    otherwise is not remembered and raises nothing: loading the model will say what is wrong.
    """
    try:
        key = probe_key(model_file, model_digest)
    except OSError:
        return  # no such model file: loading it says so
    if key in _PASSED:
        return
    marker = None if home is None else home / "cache" / f"llama-probe-{key}"
    if marker is not None and os.path.lexists(marker):
        _PASSED.add(key)
        return
    result = run_probe(model_file, stop=stop)
    if result.crashed:
        raise LlamaCrashError(result.problem)
    if not result.ok:
        return
    _PASSED.add(key)
    if marker is not None:
        _remember(marker)


def _remember(marker: Path) -> None:
    """Create the empty private marker file (and its private folder); a cache only, so a failure is ignored."""
    from emelex_memory import EmelexError
    from emelex_memory import create_private_file, ensure_private_dir

    try:
        ensure_private_dir(marker.parent)
        create_private_file(marker)
    except (EmelexError, OSError):
        pass  # the next process probes again


def main(argv: list[str] | None = None) -> int:
    """`python -m emelex_llamacpp.probe MODEL.gguf`: print the probe's answer; 0 when llama.cpp generated."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m emelex_llamacpp.probe MODEL.gguf", file=sys.stderr)
        return 2
    result = run_probe(args[0])
    if result.ok:
        print(f"llama.cpp generated {result.generated_tokens} tokens on this CPU")
        return 0
    print(result.problem, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
