"""The template `emelex plugins new NAME` copies: a plugin package with a summarizer, a distiller and a tool, and
its tests written with `emelex_workers.plugin_testing` (docs/plugins.md, "Your first plugin").

The files are `string.Template` texts (`*.tmpl`): `$name` is the plugin's entry-point name, `$package` its import
package (`emelex_<name>`) and `$distribution` its distribution (`emelex-<name>`, with hyphens). `new_plugin`
writes them.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from string import Template

from emelex_memory import InvalidInputError, StoreExistsError

HERE = Path(__file__).parent
NAME = re.compile(r"[a-z][a-z0-9_]{0,30}")


def template_files() -> list[Path]:
    """The template's files, relative to this folder, sorted."""
    return sorted(p.relative_to(HERE) for p in HERE.rglob("*.tmpl"))


def _nearest_name(name: str) -> str:
    """The good plugin name nearest to `name`: lowercased, each run of other characters one underscore between
    words, no leading digit, at most 31 characters; 'notes' when nothing of it is left."""
    nearest = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_").lstrip("0123456789_")[:31].rstrip("_")
    return nearest if NAME.fullmatch(nearest) else "notes"


def new_plugin(name: str, parent: Path) -> Path:
    """Write a new plugin package named `name` in `parent/emelex-<name>` and return that folder.

    Raises `InvalidInputError` for a name that is not `[a-z][a-z0-9_]{0,30}`, for a `parent` that is not an existing
    folder or cannot be written, and `StoreExistsError` when the package's folder exists. The files are written in a
    temporary folder beside it, then renamed into place: a failure leaves nothing behind."""
    if not NAME.fullmatch(name):
        raise InvalidInputError(
            f"plugin name {name!r} is not a lowercase identifier of at most 31 characters ([a-z][a-z0-9_]*): it is "
            f"the entry-point name, the summarizer's and the distiller's; choose e.g. {_nearest_name(name)!r}")
    if not parent.is_dir():
        raise InvalidInputError(f"{parent} is not an existing folder: create it first, or pass another --directory")
    values = {"name": name, "package": f"emelex_{name}", "distribution": f"emelex-{name.replace('_', '-')}"}
    target = parent / values["distribution"]
    if target.exists():
        raise StoreExistsError(f"{target} already exists: choose another name or folder (--directory), or move it away")
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=parent))
        try:
            for rel in template_files():
                out = staging / str(rel.with_suffix("")).replace("package", values["package"], 1)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(Template((HERE / rel).read_text()).substitute(values))
            staging.chmod(0o755)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    except OSError as exc:
        raise InvalidInputError(f"cannot write the plugin package in {parent}: {exc.strerror or exc}; choose a folder "
                                "you can write to (--directory)") from None
    return target
