"""`import emelex_memory` imports no submodule; every public name is still importable from the package."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import emelex_memory
loaded = sorted(m for m in sys.modules if m.startswith("emelex_memory"))
from emelex_memory import registered_kinds
print(json.dumps({"loaded": loaded, "kinds": list(registered_kinds()), "dir": dir(emelex_memory),
                  "all": emelex_memory.__all__}))
"""


def _probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_importing_the_package_imports_no_submodule() -> None:
    assert _probe()["loaded"] == ["emelex_memory"]


def test_every_public_name_resolves_and_is_listed() -> None:
    import emelex_memory

    found = _probe()
    assert set(found["all"]) <= set(found["dir"])
    for name in emelex_memory.__all__:
        getattr(emelex_memory, name)  # an unresolvable name raises
    assert "MemoryStore" in found["all"] and len(found["all"]) > 150


def test_the_registry_has_the_built_in_kinds_without_opening_a_store() -> None:
    assert {"compaction", "distill"} <= set(_probe()["kinds"])
