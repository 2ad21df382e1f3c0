"""`MemoryStore`'s face is written down: every public method of each of its services is a method of the store, in
store.py, with the service's own signature and docstring, handing the call on to the service; the services are still
built on first use. So is the package's: each public name of `emelex_memory` is imported, for readers and type
checkers, from where it is defined. scripts/store_face.py writes both; this keeps them in step with it."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import sys
from pathlib import Path

from emelex_memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("store_face", ROOT / "scripts" / "store_face.py")
store_face = sys.modules.setdefault("store_face", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(store_face)


def test_store_py_and_the_package_imports_are_what_the_face_script_writes() -> None:
    assert store_face.generated() == store_face.STORE.read_text(encoding="utf-8"), (
        "emelex_memory/store.py is out of step with its services: run `python scripts/store_face.py`")
    assert store_face.exported() == store_face.PACKAGE_INIT.read_text(encoding="utf-8"), (
        "emelex_memory/__init__.py's TYPE_CHECKING imports are out of step with _EXPORTS: run "
        "`python scripts/store_face.py`")


def _services() -> dict[str, type]:
    tree = ast.parse(store_face.STORE.read_text(encoding="utf-8"))
    return {attribute: getattr(importlib.import_module(module), cls)
            for attribute, module, cls in store_face.services(tree)}


def test_every_public_method_of_every_service_is_a_method_of_the_store_with_its_signature_and_docstring() -> None:
    services = _services()
    assert {"sessions", "jobs", "assets", "compaction", "knowledge", "search_index"} <= set(services)
    faced = 0
    for attribute, cls in services.items():
        for name, member in vars(cls).items():
            if name.startswith("_") or name in store_face.UNFACED.get(attribute, ()):
                continue
            own = vars(MemoryStore).get(name)
            assert own is not None, f"store.{attribute}.{name} has no store.{name}"
            if isinstance(member, property):
                assert isinstance(own, property) and own.__doc__ == member.__doc__, name
            else:
                assert inspect.signature(own) == inspect.signature(member), name
                assert inspect.getdoc(own) == inspect.getdoc(member), name
            faced += 1
    assert faced >= 60


def test_a_method_of_the_store_hands_the_call_to_its_service(store: MemoryStore, workspace: Path) -> None:
    session = store.create_session(workspace, title="walked")
    assert store.sessions.get_session(session.id) == store.get_session(session.id)
    assert store.resolve_session_id(session.id[:8]) == session.id


def test_services_are_built_on_first_use_and_once(store: MemoryStore) -> None:
    assert "knowledge" not in vars(store)
    assert store.knowledge is store.knowledge
    assert "knowledge" in vars(store) and "maintenance" not in vars(store)
