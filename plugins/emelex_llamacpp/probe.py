"""Does llama.cpp run on this CPU? One short multi-token generation in a child process.

A llama-cpp-python wheel built for another CPU (native instructions such as AVX-512 or AMX) loads and
tokenizes fine and dies with SIGILL on the first prompt longer than one token. Running that generation in a
child process turns such a crash into a one-line answer naming the rebuild command, instead of a silent exit
of the worker or the chat. Importing this module does not import llama_cpp.

`python -m emelex_llamacpp.probe MODEL.gguf` prints the answer and exits 0 when the generation ran.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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
    """What the probe found: `ok` when the child generated, else `problem`, one line saying what to do."""

    ok: bool
    problem: str = ""
    generated_tokens: int = 0


def run_probe(model_file: str | Path, *, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """Generate a few tokens with `model_file` in a child Python; never raises for what the child does.

    A child killed by a signal (SIGILL, SIGSEGV, ...) means the llama.cpp build does not fit this CPU: the
    problem names the signal and `make rebuild-llama`. A child that fails otherwise, or runs past
    `timeout_s`, is reported with its last line of output.
    """
    try:
        run = subprocess.run([sys.executable, "-c", _CHILD, str(model_file)], capture_output=True, text=True,
                             timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ProbeResult(False, f"a llama.cpp probe generation ran past {timeout_s:.0f} s (is the machine "
                                  "very busy?); run it again when it is quieter")
    except OSError as exc:
        return ProbeResult(False, f"could not start a probe process ({exc.strerror or exc})")
    if run.returncode < 0:
        try:
            name = signal.Signals(-run.returncode).name
        except ValueError:
            name = f"signal {-run.returncode}"
        return ProbeResult(False, f"llama.cpp crashed ({name}) generating on this CPU: its build does not fit "
                                  f"this machine; rebuild it with `{REBUILD}`")
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return ProbeResult(False, f"a llama.cpp probe generation failed: {last}")
    try:
        generated = int(run.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return ProbeResult(False, "a llama.cpp probe generation printed no token count")
    return ProbeResult(True, generated_tokens=generated)


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
