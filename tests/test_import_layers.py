"""The arrows point down: `core` imports no feature package, no feature package imports `store.py`, and no
emelex_memory module imports itself back through others. Every import counts, type-only and function-level ones
included, so the test reads the source (ast) rather than what a run happens to load."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "emelex_memory"
FEATURES = ("sessions", "assets", "queue", "compaction", "knowledge", "snapshots", "maintenance", "agent")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


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
        found |= {t for t in map(_target, (n for n in names if n.startswith("emelex_memory"))) if t and t != module}
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _feature(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FEATURES else None


def test_core_imports_no_feature_package() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if m.startswith("emelex_memory.core") for t in ts
                   if _feature(t) or t in ("emelex_memory.store", "emelex_memory.snapshot_guard"))
    assert not wrong, wrong


def test_no_feature_package_imports_the_store() -> None:
    wrong = sorted(f"{m} -> {t}" for m, ts in GRAPH.items() if _feature(m) for t in ts
                   if t in ("emelex_memory", "emelex_memory.store", "emelex_memory.snapshot_guard"))
    assert not wrong, wrong


def _cycle() -> list[str] | None:
    """One import cycle among emelex_memory modules, as the modules along it, or None."""
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
