"""The arrows point down, in all three packages. emelex_memory: `core` imports no feature package, no feature
package imports `store.py`, and the core imports nothing of the workers or the plugins. emelex_workers: each
folder imports only the floors below it (the host nothing, the agent and the worker the host, the CLI everything,
the demo the CLI). The built-in plugins under plugins/: only the public APIs. And no module anywhere imports
itself back through others. Every import counts, type-only and function-level ones included, so the test reads
the source (ast) rather than what a run happens to load."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
PLUGINS = ROOT / "plugins"
FEATURES = ("sessions", "assets", "queue", "compaction", "knowledge", "snapshots", "maintenance", "agent", "search",
            "interchange")
# top-level package -> the directory that holds it: the two packages, and each built-in plugin package
TOPS = {"emelex_memory": ROOT, "emelex_workers": ROOT} | {
    d.name: PLUGINS for d in sorted(PLUGINS.iterdir()) if (d / "__init__.py").is_file()}
# emelex_workers folder -> the other emelex_workers folders (or modules) it may import
WORKER_FLOORS = {
    "settings": set(),  # the ground floor: the workers' settings, which every floor may be given
    "host": {"settings"},
    "models": {"settings"},
    "plugin_api": {"host", "models.threads", "models.manager", "settings"},  # the model threads a binding uses; the
    # default model's file (the llamacpp embedder's default); its settings
    "hookspecs": {"host"},
    "faithfulness": {"host", "worker.attempts"},  # the guards word an attempt as every user-facing text does
    "worker": {"host", "models", "faithfulness", "settings"},
    "agent": {"host", "settings"},
    "interop": set(),  # other agents' histories, the export file and the MCP server: over the core only
    "cli": {"host", "models", "faithfulness", "worker", "agent", "interop", "settings"},
    "demo": {"cli", "settings"},
}
# what a built-in plugin may import of the two packages: their public APIs
PUBLIC = {"emelex_memory", "emelex_workers.plugin_api", "emelex_workers.hookspecs", "emelex_workers.faithfulness"}


def _module_name(path: Path, base: Path) -> str:
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p, base): p for top, base in TOPS.items() for p in (base / top).rglob("*.py")}


def _target(name: str) -> str | None:
    """The emelex_memory module `name` loads: itself, or the nearest enclosing module that exists."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found |= {t for t in map(_target, (n for n in names if n.split(".")[0] in TOPS)) if t and t != module}
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _feature(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "emelex_memory" and parts[1] in FEATURES else None


def test_core_imports_no_feature_package() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("emelex_memory.core") for t in ts
                   if _feature(t) or t in ("emelex_memory.store", "emelex_memory.snapshot_guard"))
    assert not wrong, wrong


def test_no_feature_package_imports_the_store() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if _feature(m) for t in ts
                   if t in ("emelex_memory", "emelex_memory.store", "emelex_memory.snapshot_guard"))
    assert not wrong, wrong


def _unit(module: str) -> str:
    """The part of emelex_memory `module` belongs to: its folder (`sessions`, `core`, ...) or its top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_core_folders_import_each_other_one_way_only() -> None:
    """No folder (or top-level module) of emelex_memory imports one that imports it back, however indirectly: each
    stands on the ones below it, so an import never runs up (the store's replay view, say, lives where replay is)."""
    units: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        if module.startswith("emelex_memory.") and module != "emelex_memory.__init__":
            units.setdefault(_unit(module), set()).update(
                _unit(t) for t in targets if t.startswith("emelex_memory.") and _unit(t) != _unit(module))
    state: dict[str, int] = {}

    def circle(unit: str, path: list[str]) -> list[str] | None:
        state[unit] = 1
        for target in sorted(units.get(unit, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target] if target in path else [unit, target]
            if target not in state and (found := circle(target, [*path, target])):
                return found
        state[unit] = 2
        return None

    for unit in sorted(units):
        if unit not in state and (found := circle(unit, [unit])):
            raise AssertionError(f"emelex_memory's folders import each other in a circle: {' -> '.join(found)}")


# What the core may import from outside itself: the standard library's public modules and its four dependencies.
# Not pluggy, typer, llama_cpp, httpx, mcp or any other package of the workers, the plugins or an extra.
CORE_DEPENDENCIES = {"apsw", "pydantic", "pydantic_settings", "tenacity"}


def test_the_core_imports_only_the_standard_library_and_its_own_dependencies() -> None:
    import sys

    wrong = []
    for module, path in MODULES.items():
        if not module.startswith("emelex_memory"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                ours = top == "emelex_memory" or top == "__future__"
                standard = top in sys.stdlib_module_names and not top.startswith("_")  # no CPython internals
                if not (ours or standard or top in CORE_DEPENDENCIES):
                    wrong.append(f"{module} imports {name}")
    assert not wrong, wrong


def test_the_core_imports_neither_the_workers_nor_the_plugins() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("emelex_memory") for t in ts
                   if not t.startswith("emelex_memory"))
    assert not wrong, wrong


def _floor(module: str) -> str | None:
    """The emelex_workers folder (or top-level module) `module` belongs to; None for emelex_workers itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "emelex_workers" and len(parts) > 1 else None


def _allowed(source: str, target: str) -> bool:
    """Whether emelex_workers module `source` may import `target` of emelex_workers (see WORKER_FLOORS)."""
    floor, inner = _floor(source), target.removeprefix("emelex_workers.")
    return _floor(target) == floor or any(inner == f or inner.startswith(f"{f}.") for f in WORKER_FLOORS[floor])


def test_each_workers_folder_imports_only_the_floors_below_it() -> None:
    assert set(filter(None, map(_floor, MODULES))) == set(WORKER_FLOORS)  # a new folder gets its row
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if _floor(m) for t in ts
                   if t.startswith("emelex_workers") and not _allowed(m, t))
    assert not wrong, wrong
    assert not GRAPH["emelex_workers"]  # the package itself is a docstring: importing it loads nothing


def test_the_workers_import_no_plugin() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("emelex_workers") for t in ts
                   if t.split(".")[0] not in ("emelex_memory", "emelex_workers"))
    assert not wrong, wrong


def test_plugins_import_only_the_public_apis() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if TOPS[m.split(".")[0]] == PLUGINS for t in ts
                   if t.split(".")[0] != m.split(".")[0] and t not in PUBLIC)
    assert not wrong, wrong


def _cycle() -> list[str] | None:
    """One import cycle among the modules of emelex_memory, emelex_workers and the plugins, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle)


def test_the_graph_sees_type_only_and_relative_imports() -> None:
    assert "emelex_memory.core.database" in GRAPH["emelex_memory.sessions.service"]
    assert "emelex_memory.errors" in GRAPH["emelex_memory.core.migrations"]
    assert len(MODULES) > 40
    assert "emelex_workers.host.tools" in GRAPH["emelex_workers.host.hookspecs"]  # under TYPE_CHECKING
    assert "emelex_workers.host.manager" in GRAPH["emelex_workers.worker.work"]  # inside a function, relative
    assert "emelex_workers.faithfulness" in GRAPH["emelex_llamacpp.prompts"]  # a plugin, through the public API
    assert {"emelex_llamacpp", "emelex_tools"} <= set(TOPS)


def _public_names(module: str) -> set[str]:
    """The public names `module` defines at its top level (functions, classes, assigned names), read from source."""
    found = set()
    for node in ast.parse(MODULES[module].read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in found if not n.startswith("_")}


def test_the_re_exporting_packages_export_every_public_name() -> None:
    """A name added to a module behind a stable import path is importable from that path too."""
    import emelex_workers.faithfulness
    import emelex_workers.hookspecs
    import emelex_workers.models
    import emelex_workers.plugin_api

    behind = {
        emelex_workers.faithfulness: ["emelex_workers.faithfulness.checks"],
        emelex_workers.models: ["emelex_workers.models.manager"],
        emelex_workers.plugin_api: ["emelex_workers.host.types", "emelex_workers.host.tools",
                                    "emelex_workers.host.notes", "emelex_workers.host.policies",
                                    "emelex_workers.host.gbnf"],
        emelex_workers.hookspecs: ["emelex_workers.host.hookspecs"],
    }
    for package, modules in behind.items():
        missing = sorted(set().union(*map(_public_names, modules)) - {"__all__"} - set(package.__all__))
        assert not missing, f"{package.__name__} does not export {missing}"
