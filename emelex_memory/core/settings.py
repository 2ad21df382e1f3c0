"""Settings: the core's pydantic-settings class, read from arguments, `EMELEX_*` variables and an optional TOML file.

Precedence, highest first: keyword arguments, environment variables
(`EMELEX_HOME`, `EMELEX_BUSY_TIMEOUT_MS`, ...), `<Emelex Home>/config.toml`,
then the defaults below. Settings are passed explicitly to what needs them;
nothing deeper in the code reads the environment.

`Settings` holds what the store itself uses. The layers built on the core
extend it with their own fields in a subclass (the workers' is
`emelex_workers.settings.WorkerSettings`: the worker, the model manager, the
agent and the built-in plugins), read the same way from the same variables
and the same config.toml. A subclass makes itself known to the core through
the `emelex.settings` entry-point group, so that a config.toml key or a
variable one layer owns is no unknown setting to another: the core consults
that group only when it meets a name that is none of its own fields.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ..errors import InvalidHomeError, SettingsFileError
from .io_errors import file_error
from .private_files import check_no_symlink_loop, open_for_reading
from .utf8 import SQLITE_NAMES, is_utf8

MiB = 1024 * 1024
MAX_CONFIG_BYTES = MiB  # config.toml is read whole; a larger one is refused
ENV_PREFIX = "EMELEX_"
# EMELEX_* variables that are not settings but are read by Emelex's own tools (scripts/setup-venv's wheel cache).
OTHER_VARIABLES = ("EMELEX_WHEEL_CACHE",)


def _home_from(init: dict[str, Any]) -> Path:
    """Emelex Home as given (argument, then EMELEX_HOME, then the default) with `~` expanded; it must then be
    absolute, or the store would depend on the current directory (cron's is not your shell's), and valid UTF-8, or
    SQLite could not open the database in it (`InvalidHomeError`, also for a `~user` naming no user)."""
    raw = init.get("home") or os.environ.get("EMELEX_HOME") or "~/.emelex"
    try:
        home = Path(raw).expanduser()
    except RuntimeError:  # `~user` naming no user, or `~` without HOME or a passwd entry
        raise InvalidHomeError(
            f"EMELEX_HOME {str(raw)!r} starts with a ~ that names no known home directory; set it to an absolute path"
        ) from None
    if not is_utf8(str(home)):
        raise InvalidHomeError(
            f"EMELEX_HOME {str(home)!r:.300} is not valid UTF-8, and {SQLITE_NAMES}: set it to a path whose name is "
            "UTF-8"
        )
    if not home.is_absolute():
        raise InvalidHomeError(
            f"EMELEX_HOME must be an absolute path (or start with ~), got {str(raw)!r}: a relative Home would depend "
            "on the current directory; set it to an absolute path"
        )
    return home


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings table of the TOML file `path`, or {} when there is none.

    Opened without following a symlink and without blocking, and read only
    when it is a regular file of at most `MAX_CONFIG_BYTES`; anything else
    (a symlink, a FIFO, too large, not UTF-8 TOML) raises `SettingsFileError`.
    A file the operating system fails to open or read raises its typed error
    (`io_errors.file_error`), naming the file.
    """
    return _read_config(path)[0]


def _read_config(path: Path) -> tuple[dict[str, Any], str]:
    """`read_config_file` and the file's text ("" when there is none)."""
    try:
        fd = open_for_reading(path)
    except (FileNotFoundError, NotADirectoryError):
        return {}, ""
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):  # not a loop among its parents
            raise SettingsFileError(
                f"{path} is a symlink; Emelex never follows symlinks in its Home: replace it with the file it points to"
            ) from None
        raise file_error(exc, path, "reading the settings file") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SettingsFileError(f"{path} is not a regular file; replace it with a TOML file or remove it")
        chunks, size = [], 0
        while size <= MAX_CONFIG_BYTES and (chunk := os.read(fd, MAX_CONFIG_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise file_error(exc, path, "reading the settings file") from exc
    finally:
        os.close(fd)
    if size > MAX_CONFIG_BYTES:
        raise SettingsFileError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes; shorten it")
    import tomllib  # here: a run without a settings file never needs it

    try:
        text = b"".join(chunks).decode("utf-8")
        return tomllib.loads(text), text
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SettingsFileError(f"{path} is not valid TOML ({exc}); fix or remove it") from None


def key_line(text: str, key: str) -> int | None:
    """The 1-based line of `text` (TOML) where the top-level `key` is set (`key = ...`, a dotted `key.x = ...` or a
    `[key]` table), or None when no line is found (tomllib parses keys but says nothing of where they were)."""
    import re

    name = "|".join(re.escape(k) for k in (key, f'"{key}"', f"'{key}'"))
    pattern = re.compile(rf"^\s*\[{{0,2}}\s*(?:{name})\s*[=.\]]")
    return next((n for n, line in enumerate(text.splitlines(), 1) if pattern.match(line)), None)


def _where(path: Path, text: str, key: str) -> str:
    """`path line N` for the line of config.toml (`text`) setting `key`, or `path` when none is found."""
    line = key_line(text, key)
    return f"{path}{f' line {line}' if line else ''}"


SETTINGS_GROUP = "emelex.settings"  # entry points: the settings classes the layers above build on `Settings`


@functools.lru_cache(maxsize=1)
def _other_layers() -> dict[str, object]:
    """The fields of every settings class registered in the `emelex.settings` entry-point group, by name (a class
    that fails to load adds none: its keys are then unknown, as they would be without it)."""
    from importlib.metadata import entry_points

    fields: dict[str, object] = {}
    for point in entry_points(group=SETTINGS_GROUP):
        try:
            fields.update(point.load().model_fields)
        except Exception:  # noqa: BLE001 - a broken installation: its settings are simply not known
            continue
    return fields


def setting_names(settings_class: type[Settings] | None = None) -> list[str]:
    """Every setting name `settings_class` (default `Settings`) accepts from config.toml or the environment: its
    own fields and those the other layers' settings classes add (see `SETTINGS_GROUP`), `home` left out."""
    own = list((settings_class or Settings).model_fields)
    return [name for name in dict.fromkeys([*own, *_other_layers()]) if name != "home"]


def _is_setting(name: str, settings_class: type[Settings]) -> bool:
    """Whether `name` is a setting of `settings_class` or of another layer's settings class."""
    return name in settings_class.model_fields or name in _other_layers()


def nearest_setting(name: str, *, cutoff: float = 0.6, settings_class: type[Settings] | None = None) -> str | None:
    """The setting whose name is closest to `name` (difflib's ratio at least `cutoff`), or None when none is; among
    `setting_names(settings_class)`."""
    import difflib

    match = difflib.get_close_matches(name.lower(), setting_names(settings_class), n=1, cutoff=cutoff)
    return match[0] if match else None


def _checked_config(settings_class: type[Settings], path: Path, values: dict[str, Any], text: str) -> dict[str, Any]:
    """The keys of `values` that are fields of `settings_class`, when every key is a setting config.toml may set
    (its own, or another layer's: that layer's class reads it); else `SettingsFileError` naming the file, the line
    and the nearest setting, so that no key is silently ignored."""
    own = {}
    for key in values:
        if key in settings_class.model_fields and key != "home":
            own[key] = values[key]
            continue
        if key != "home" and not isinstance(values[key], dict) and key in _other_layers():
            continue
        where = _where(path, text, key)
        if key == "home":
            raise SettingsFileError(
                f"{where}: 'home' cannot be set in config.toml, which is read from the Home it would choose; set "
                "EMELEX_HOME (or pass home=) instead and remove the line")
        if isinstance(values[key], dict):
            raise SettingsFileError(
                f"{where}: {key!r} is a table ([{key}] or a dotted key {key}.NAME), and config.toml takes only "
                "top-level settings (name = value, before any [table]); move the settings out of it and remove the "
                "line")
        nearest = nearest_setting(key, settings_class=settings_class)
        hint = (f"did you mean {nearest!r}? (fix or remove the line)" if nearest
                else "remove the line, then `emelex config show` lists every setting")
        raise SettingsFileError(f"{where}: unknown setting {key!r}; {hint}")
    return own


class Settings(BaseSettings):
    """Every tunable of the Emelex Memory store, with safe defaults (the workers' are in their subclass,
    `emelex_workers.settings.WorkerSettings`)."""

    # An empty EMELEX_* variable counts as unset, as it does for finding config.toml (`_home_from`). The model_*
    # fields are ours, not pydantic's: pydantic before 2.10 warns about them unless told so.
    model_config = SettingsConfigDict(
        env_prefix="EMELEX_", extra="forbid", env_ignore_empty=True, protected_namespaces=("settings_",)
    )

    _arguments: frozenset[str] = PrivateAttr(default_factory=frozenset)

    home: Path = Field(default=Path("~/.emelex"), description="Emelex Home; the database lives in <home>/memory.")
    busy_timeout_ms: int = Field(default=5000, ge=0, le=600_000, description="Bounded SQLite busy wait.")
    session_lease_ttl_s: float = Field(default=60.0, gt=0, le=86_400, description="Session lease lifetime.")
    worker_lease_ttl_s: float = Field(default=300.0, gt=0, le=86_400, description="Worker job lease lifetime.")

    max_event_bytes: int = Field(default=1 * MiB, ge=256, description="Canonical JSON bytes per event.")
    max_turn_bytes: int = Field(default=4 * MiB, ge=256, description="Canonical JSON bytes per turn.")
    max_json_depth: int = Field(
        default=64, ge=1, le=200, description="Nesting depth of an event payload (the encoders recurse; 200 keeps "
        "them far below Python's recursion limit)."
    )
    max_events_per_turn: int = Field(default=256, ge=1, description="Events in one append_turn.")

    page_items: int = Field(default=500, ge=1, description="Default items per collection page.")
    max_page_items: int = Field(default=10_000, ge=1, description="Largest items per page a caller may ask for.")
    page_bytes: int = Field(default=8 * MiB, ge=MiB, description="Default and largest bytes per page.")

    # Knowledge, distillation and retention (`maintain`).
    knowledge_source_max_bytes: int = Field(
        default=16 * MiB, ge=MiB, description="Largest transcript range a Knowledge provenance or distillation reads."
    )
    session_retention_days: float = Field(
        default=0.0, ge=0, description="maintain deletes Sessions idle this many days; 0 keeps them forever."
    )
    knowledge_retention_days: float = Field(
        default=0.0, ge=0, description="maintain tombstones unpinned Knowledge unchanged this many days; 0 never."
    )
    knowledge_grace_days: float = Field(
        default=30.0, gt=0, description="Days a tombstone or superseded version is kept before maintain deletes it."
    )
    knowledge_keep_versions: int = Field(
        default=20, ge=1, le=10_000, description="Newest versions maintain always keeps per Knowledge entry."
    )
    maintain_batch: int = Field(
        default=1000, ge=1, le=100_000, description="Most changes of each kind one maintain run makes."
    )

    # Model snapshots and saved model states: the store's side of installed models.
    model_lock_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, description="Longest wait for the Home-wide snapshot-mutation lock."
    )
    model_states_keep: int = Field(
        default=8, ge=0, le=10_000, description="Saved model states (a Session's evaluated context) maintain keeps.")
    model_states_max_bytes: int = Field(
        default=1024 * MiB, ge=0, description="Bytes of saved model states maintain keeps, newest first.")

    def __init__(self, **values: Any) -> None:
        """Settings from `values` (keyword arguments), then `EMELEX_*` variables, `<home>/config.toml` and the
        defaults. An unknown or forbidden key in config.toml raises `SettingsFileError` naming the file and line."""
        super().__init__(**values)
        self._arguments = frozenset(k for k in values if not k.startswith("_"))

    @field_validator("home", mode="before")
    @classmethod
    def _home_not_empty(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            raise ValueError("home must not be empty (leave it out for the default, ~/.emelex)")
        return value

    @model_validator(mode="after")
    def _caps_fit(self) -> Settings:
        if self.max_event_bytes > self.page_bytes:
            raise ValueError("max_event_bytes must not exceed page_bytes, or a replay page could not hold one event")
        if self.page_items > self.max_page_items:
            raise ValueError("page_items must not exceed max_page_items")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Sources in precedence order: arguments, `EMELEX_*` variables, then `<home>/config.toml`."""
        home = _home_from(init_settings())
        check_no_symlink_loop(home, what="Emelex Home")  # not blamed on config.toml below it
        path = home / "config.toml"
        toml = InitSettingsSource(settings_cls, _checked_config(settings_cls, path, *_read_config(path)))
        return (init_settings, env_settings, toml)

    @property
    def home_dir(self) -> Path:
        """Emelex Home with `~` expanded, made absolute (not resolved: symlinks are checked, not followed)."""
        return Path(os.path.abspath(self.home.expanduser()))

    @property
    def memory_dir(self) -> Path:
        """The directory holding the standard database."""
        return self.home_dir / "memory"

    @property
    def database_path(self) -> Path:
        """The standard database file, `<home>/memory/emelex.sqlite3`."""
        return self.memory_dir / "emelex.sqlite3"


@dataclass(frozen=True)
class SettingSource:
    """Where one setting's value came from: `source` is "default", "argument", "environment" (`where` is the
    variable's name) or "file" (`where` is config.toml's path, with the line when it is found)."""

    source: Literal["default", "argument", "environment", "file"]
    where: str = ""

    def __str__(self) -> str:
        return f"{self.source} {self.where}".strip()


def setting_sources(settings: Settings) -> dict[str, SettingSource]:
    """Where each of `settings`' values came from, by field name, in the precedence the settings were built with
    (arguments, then `EMELEX_*` variables, then `<home>/config.toml`, then defaults). Re-reads config.toml."""
    path = settings.home_dir / "config.toml"
    values, text = _read_config(path)
    environment = _environment()
    sources = {}
    for name in type(settings).model_fields:
        variable = ENV_PREFIX + name.upper()
        if name in settings._arguments:
            sources[name] = SettingSource("argument")
        elif variable in environment:
            sources[name] = SettingSource("environment", environment[variable])
        elif name in values:
            sources[name] = SettingSource("file", _where(path, text, name))
        else:
            sources[name] = SettingSource("default")
    return sources


def source_of(name: str) -> SettingSource:
    """Where the setting `name` would come from for `Settings()` (no arguments): its variable, config.toml (with
    the line) or the default; for naming the culprit of an invalid value. Never raises."""
    variable = _environment().get(ENV_PREFIX + name.upper())
    if variable:
        return SettingSource("environment", variable)
    try:
        path = _home_from({}) / "config.toml"
        values, text = _read_config(path)
    except Exception:  # noqa: BLE001 - only a hint for a message that is being built
        return SettingSource("default")
    return SettingSource("file", _where(path, text, name)) if name in values else SettingSource("default")


def unknown_environment(settings_class: type[Settings] | None = None) -> list[tuple[str, str | None]]:
    """Every set `EMELEX_*` variable that is no setting of `settings_class` (default `Settings`) nor of another
    layer's settings class (nor in `OTHER_VARIABLES`), sorted, each with the nearest setting's variable (None when
    none is close: a variable of some other tool is not a near miss). Settings ignore such variables; the CLI warns
    of the near misses."""
    settings_class = settings_class or Settings
    found = []
    for key, value in os.environ.items():
        upper = key.upper()
        if not upper.startswith(ENV_PREFIX) or not value or upper in OTHER_VARIABLES:
            continue
        if _is_setting(upper[len(ENV_PREFIX):].lower(), settings_class):
            continue
        nearest = nearest_setting(upper[len(ENV_PREFIX):], cutoff=0.8, settings_class=settings_class)
        found.append((key, None if nearest is None else ENV_PREFIX + nearest.upper()))
    return sorted(found)


def _environment() -> dict[str, str]:
    """Set (non-empty) variables by their upper-case name: the actual name, as pydantic-settings matches them
    without regard to case."""
    return {k.upper(): k for k, v in os.environ.items() if v}
