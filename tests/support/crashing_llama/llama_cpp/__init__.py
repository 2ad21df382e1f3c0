"""A stand-in for a llama-cpp-python build made for another CPU: loading a model kills the process with SIGILL, as
the AMX kernels of such a build do on a CPU without them. Put this folder first on PYTHONPATH (test_llama_probe.py)."""

import os
import signal


class Llama:
    def __init__(self, *args, **kwargs) -> None:
        os.kill(os.getpid(), signal.SIGILL)
