"""The template `emelex plugins new NAME` copies: a plugin package with a summarizer, a distiller and a tool, and
its tests written with `emelex_workers.plugin_testing` (docs/plugins.md, "Your first plugin").

The files are `string.Template` texts (`*.tmpl`): `$name` is the plugin's entry-point name, `$package` its import
package (`emelex_<name>`) and `$distribution` its distribution (`emelex-<name>`, with hyphens). `new_plugin`
writes them.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from emelex_memory import InvalidInputError, StoreExistsError

HERE = Path(__file__).parent
NAME = re.compile(r"[a-z][a-z0-9_]{0,30}")


def template_files() -> list[Path]:
    """The template's files, relative to this folder, sorted."""
    return sorted(p.relative_to(HERE) for p in HERE.rglob("*.tmpl"))


def new_plugin(name: str, parent: Path) -> Path:
    """Write a new plugin package named `name` in `parent/emelex-<name>` and return that folder.

    Raises `InvalidInputError` for a name that is not `[a-z][a-z0-9_]{0,30}` and `StoreExistsError` when the
    folder exists (nothing is written then)."""
    if not NAME.fullmatch(name):
        raise InvalidInputError(
            f"plugin name {name!r} is not a lowercase identifier of at most 31 characters ([a-z][a-z0-9_]*): it is "
            "the entry-point name, the summarizer's and the distiller's; choose e.g. 'notes'")
    values = {"name": name, "package": f"emelex_{name}", "distribution": f"emelex-{name.replace('_', '-')}"}
    target = parent / values["distribution"]
    if target.exists():
        raise StoreExistsError(f"{target} already exists: choose another name or folder (--directory), or move it away")
    for rel in template_files():
        out = target / str(rel.with_suffix("")).replace("package", values["package"], 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(Template((HERE / rel).read_text()).substitute(values))
    return target
