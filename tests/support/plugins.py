"""Test support: install small plugin distributions for real entry-point discovery, and a fake GGUF model.

A "distribution" here is a module plus a `<name>-<version>.dist-info` directory
(METADATA and entry_points.txt) in a directory on `sys.path` / `PYTHONPATH`,
which is exactly what `importlib.metadata` reads for an installed package.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

PLUGIN_SOURCE = Path(__file__).parent / "plugin_dist" / "emelex_fakeplugin.py"
FAKE_MODEL_BYTES = b"GGUF\x03\x00\x00\x00emelex-fake-model" + bytes(range(256)) * 4


def make_distribution(
    root: Path, dist: str, version: str, modules: dict[str, str], entry_points: dict[str, str]
) -> Path:
    """Write modules and a dist-info with `emelex` entry points (name -> "module[:attr]") under `root`; return it."""
    root.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (root / f"{name}.py").write_text(source)
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[emelex]\n{lines}")
    return root


def fake_plugin_distribution(root: Path) -> Path:
    """The `emelex-fakeplugin` 1.2.3 distribution (entry point "fake") under `root`."""
    return make_distribution(
        root, "emelex-fakeplugin", "1.2.3", {"emelex_fakeplugin": PLUGIN_SOURCE.read_text()},
        {"fake": "emelex_fakeplugin"},
    )


def activate(monkeypatch, root: Path) -> None:
    """Put a distribution directory on sys.path for this test (and forget cached metadata and modules)."""
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m.startswith("emelex_fakeplugin") or m.startswith("emelex_broken")]:
        monkeypatch.delitem(sys.modules, name)


def fake_model_file(directory: Path, name: str = "fake.gguf") -> Path:
    """A small file the fake plugin binds (and that looks like a GGUF to the installer)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(FAKE_MODEL_BYTES)
    return path

