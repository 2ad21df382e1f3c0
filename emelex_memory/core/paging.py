"""One paging mechanism: `Page[T]` (a page of items and the cursor to continue from) and `take`, the one
bounded take the paged listings use to cut the rows they read into a page bounded in items and in bytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")


@dataclass(frozen=True)
class Page(Generic[T]):
    """A page of items in the listing's order. Pass `next_cursor` back to continue; it is None after the last page.

    Each listing's page is a named frozen dataclass subclass that also offers the items under the listing's own
    name (`JobPage.jobs`, `SessionPage.sessions`, ...; see `Items`).
    """

    items: list[T]
    next_cursor: str | None


class Items(Generic[T]):
    """A named page's items under the listing's own name: `jobs = Items[Job]()` in `class JobPage(Page[Job])`
    makes `page.jobs` the page's `items` (read-only, like every field of a page)."""

    @overload
    def __get__(self, page: None, owner: type) -> Items[T]: ...
    @overload
    def __get__(self, page: Page[T], owner: Any = None) -> list[T]: ...
    def __get__(self, page: Page[T] | None, owner: Any = None) -> list[T] | Items[T]:
        """`page.items`; the descriptor itself when read from the class."""
        return self if page is None else page.items


def take(
    rows: Sequence[R],
    limit: int,
    max_bytes: int,
    size: Callable[[R], int],
    cursor: Callable[[R], C],
    *,
    at_least_one: bool = False,
) -> tuple[list[R], C | None]:
    """Take rows in order, at most `limit` of them, while their `size`s add up to at most `max_bytes`.

    `rows` is what the query read: up to `limit + 1` rows, the one past `limit`
    only telling that more follow. Returns the rows taken and `cursor(last row
    taken)` when rows follow that were not taken, else None. A first row larger
    than `max_bytes` is taken anyway with `at_least_one` (the page still
    progresses); without it the page is empty and its cursor None (callers
    whose `max_bytes` is validated to fit their largest row never meet it).
    """
    taken: list[R] = []
    total = 0
    for row in rows[:limit]:
        total += size(row)
        if total > max_bytes and (taken or not at_least_one):
            break
        taken.append(row)
    return taken, cursor(taken[-1]) if taken and len(taken) < len(rows) else None
