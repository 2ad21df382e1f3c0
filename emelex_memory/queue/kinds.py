"""Job kinds and the registry that names them: what a queue may hold and how each kind's result is applied.

A store takes a `JobKindRegistry` (by default the one of `emelex_memory.job_kinds`, with the built-in kinds);
its queue only enqueues, claims and completes kinds registered there. A built-in kind is registered by where
it lives ("package.module:ATTRIBUTE"), so registering it imports nothing: its module is imported the first
time a job of that kind is validated or completed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError, InvalidJobSourceError, UnknownJobKindError

if TYPE_CHECKING:
    from .jobs import CompletionContext

CompleteFn = Callable[["CompletionContext", Any], "Mapping[str, Any] | None"]
ValidateFn = Callable[["Mapping[str, Any]"], None]


@dataclass(frozen=True)
class JobKind:
    """A registered job kind: its name and the function that applies a worker's result when the job completes.

    `complete(ctx, result)` runs inside the completion transaction, writes the
    kind's effect (e.g. a Summary event) and returns a small JSON mapping that
    is recorded as the job's result; raising rolls everything back. With
    `complete=None` the result itself (None or a JSON mapping) is recorded.

    `validate(source)`, when given, checks a source's shape and raises
    `InvalidJobSourceError` (or another `InvalidInputError`) for a bad one:
    `enqueue_job` runs it before writing anything, and `run_one_job` before
    the handler (a bad stored source fails the job permanently at once).
    """

    name: str
    complete: CompleteFn | None = None
    validate: ValidateFn | None = None

    def check_source(self, source: Mapping[str, Any]) -> None:
        """Run the kind's source validator, if any; whatever it raises is reported as `InvalidJobSourceError`."""
        if self.validate is None:
            return
        try:
            self.validate(source)
        except InvalidJobSourceError:
            raise
        except InvalidInputError as exc:
            raise InvalidJobSourceError(str(exc)) from None
        except Exception as exc:
            text = " ".join(str(exc).split())
            raise InvalidJobSourceError(
                f"a {self.name} job source does not validate ({type(exc).__name__}: {text:.200}); fix the source"
            ) from None


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.isidentifier() or not name.islower() or not 1 <= len(name) <= 32:
        raise InvalidInputError(f"a job kind is a lowercase identifier of 1-32 characters, got {name!r}")


class JobKindRegistry:
    """The job kinds one or more stores know, by name. Thread-safe for reads; register kinds before using them."""

    def __init__(self) -> None:
        """An empty registry."""
        self._kinds: dict[str, JobKind | str] = {}  # a str is where a deferred kind lives, "module:ATTRIBUTE"

    def register(
        self, name: str, complete: CompleteFn | None = None, *, validate: ValidateFn | None = None,
        replace: bool = False,
    ) -> JobKind:
        """Register a job kind (a lowercase identifier of 1-32 characters) here; return it.

        `complete` and the optional source validator `validate` are described
        at `JobKind`. Re-registering an existing name with other functions needs
        `replace=True`. Workers only claim registered kinds, so register a kind
        before enqueueing or working it.
        """
        _check_name(name)
        known = self._kinds.get(name)
        if known is not None and not replace:
            known = self.get(name)
            if known.complete is not complete or known.validate is not validate:
                raise InvalidInputError(f"job kind {name!r} is already registered; pass replace=True to replace it")
        kind = JobKind(name, complete, validate)
        self._kinds[name] = kind
        return kind

    def register_deferred(self, name: str, where: str) -> None:
        """Register the kind `name` that the `JobKind` at `where` ("package.module:ATTRIBUTE") defines, without
        importing it: it is imported by the first `get(name)`, which checks that its name is `name`."""
        _check_name(name)
        self._kinds[name] = where

    def get(self, name: str) -> JobKind:
        """The registered kind `name`; raise `UnknownJobKindError` if there is none."""
        try:
            kind = self._kinds[name]
        except (KeyError, TypeError):
            known = ", ".join(self.names()) or "none"
            raise UnknownJobKindError(f"no job kind {name!r} is registered (known: {known})") from None
        if isinstance(kind, str):
            module, _, attribute = kind.partition(":")
            kind = getattr(importlib.import_module(module), attribute)
            if not isinstance(kind, JobKind) or kind.name != name:
                raise TypeError(f"{self._kinds[name]} is not the JobKind {name!r}")
            self._kinds[name] = kind
        return kind

    def check(self, name: str) -> None:
        """Raise `UnknownJobKindError` unless `name` is registered (a deferred kind is not imported)."""
        if not isinstance(name, str) or name not in self._kinds:
            self.get(name)

    def names(self) -> tuple[str, ...]:
        """Names of the registered kinds, sorted."""
        return tuple(sorted(self._kinds))

    def copy(self) -> JobKindRegistry:
        """A new registry with the same kinds, to which kinds can be added without changing this one."""
        other = JobKindRegistry()
        other._kinds = dict(self._kinds)
        return other
