"""Printing one page of a paged listing, the same way for every `list` command."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import typer

from .framework import echo_json

T = TypeVar("T")


def echo_page(
    name: str,
    items: Sequence[T],
    next_cursor: str | None,
    as_json: bool,
    *,
    as_dict: Callable[[T], dict],
    line: Callable[[T], str],
    empty: str,
) -> None:
    """Print a page: with `as_json` one JSON object `{"outcome": "listed", name: [as_dict(item)...],
    "next_cursor": ...}`; otherwise `line(item)` for each item, `empty` when there are none, and the `--cursor` to
    pass for the next page."""
    if as_json:
        echo_json("listed", {name: [as_dict(i) for i in items], "next_cursor": next_cursor})
        return
    for item in items:
        typer.echo(line(item))
    if not items:
        typer.echo(empty)
    if next_cursor:
        typer.echo(f"more: --cursor {next_cursor}")
