"""The one bounded take (`core/paging.py: take`) and `Page`: item bound, byte bound, an over-large first row,
empty input, and the named pages keeping their old attribute names."""

from __future__ import annotations

from emelex_memory import JobPage, SessionPage
from emelex_memory.core.paging import Page, take


def _size(row: tuple[int, int]) -> int:
    return row[1]


def _cursor(row: tuple[int, int]) -> str:
    return f"c{row[0]}"


def test_the_item_bound_stops_the_page_and_the_cursor_names_its_last_row():
    rows = [(1, 10), (2, 10), (3, 10), (4, 10)]  # limit + 1 rows: one more follows
    assert take(rows, 3, 1000, _size, _cursor) == ([(1, 10), (2, 10), (3, 10)], "c3")


def test_a_page_holding_every_row_read_has_no_cursor():
    rows = [(1, 10), (2, 10)]
    assert take(rows, 3, 1000, _size, _cursor) == (rows, None)
    assert take(rows, 2, 20, _size, _cursor) == (rows, None)  # exactly at both bounds


def test_the_byte_bound_stops_before_the_row_that_would_pass_it():
    rows = [(1, 10), (2, 10), (3, 10), (4, 10)]
    assert take(rows, 3, 25, _size, _cursor) == ([(1, 10), (2, 10)], "c2")
    assert take(rows, 3, 20, _size, _cursor) == ([(1, 10), (2, 10)], "c2")  # a total equal to the bound fits


def test_an_over_large_first_row_gives_an_empty_page_without_a_cursor_by_default():
    rows = [(1, 50), (2, 1)]
    assert take(rows, 5, 40, _size, _cursor) == ([], None)


def test_an_over_large_first_row_is_taken_alone_with_at_least_one():
    rows = [(1, 50), (2, 1), (3, 1)]
    assert take(rows, 5, 40, _size, _cursor, at_least_one=True) == ([(1, 50)], "c1")
    assert take(rows[:1], 5, 40, _size, _cursor, at_least_one=True) == ([(1, 50)], None)


def test_only_the_first_row_may_pass_the_byte_bound():
    rows = [(1, 5), (2, 50), (3, 1)]
    assert take(rows, 5, 40, _size, _cursor, at_least_one=True) == ([(1, 5)], "c1")


def test_no_rows_give_an_empty_last_page():
    assert take([], 5, 40, _size, _cursor) == ([], None)
    assert take([], 5, 40, _size, _cursor, at_least_one=True) == ([], None)


def test_named_pages_are_pages_and_keep_their_attribute_names():
    page = JobPage(["a", "b"], "7")
    assert isinstance(page, Page)
    assert page.jobs == page.items == ["a", "b"]
    assert page.next_cursor == "7"
    assert SessionPage([], None).sessions == []
    assert page != SessionPage(["a", "b"], "7")  # pages of different listings are never equal


def test_named_pages_stay_frozen():
    page = JobPage(["a"], None)
    for name in ("jobs", "items", "next_cursor", "other"):
        try:
            setattr(page, name, [])
        except AttributeError as e:  # dataclasses.FrozenInstanceError
            assert f"cannot assign to field {name!r}" in str(e)
        else:
            raise AssertionError(f"{name} was assigned")
    assert page.jobs == ["a"]
