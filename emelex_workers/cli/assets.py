"""`emelex memory assets ...`: list, show and verify content-addressed media."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from emelex_memory import AssetInfo, AssetNotFoundError, AssetPage, EmelexError

from .common import CursorOpt, EmelexTyper, JsonFlag, echo_json, echo_page, open_store, page_limit, read_listing, when

assets_app = EmelexTyper(help="List, show and verify stored media assets.")

SHOWN_ENTRIES = 100  # media kinds of one digest that `show` prints
MAX_JSON_PROBLEMS = 1000  # problems `verify --json` lists; it counts them all


def _entry_dict(info: AssetInfo) -> dict:
    return {
        "digest": info.ref.digest,
        "media_kind": info.ref.media_kind,
        "size": info.ref.size,
        "links": info.links,
        "created_at": info.created_at,
        "touched_at": info.touched_at,
    }


@assets_app.command("list")
def assets_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Entries per page.")] = 100,
    cursor: CursorOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """List catalogued assets in digest order: digest, media kind, bytes and how many events link each (none on a
    Home without a store yet)."""
    page = read_listing(ctx, lambda store: store.list_assets(cursor=cursor, limit=limit), AssetPage([], None))
    echo_page(
        "assets", page.assets, page.next_cursor, as_json, as_dict=_entry_dict, empty="no assets",
        line=lambda a: f"{a.ref.digest}  {a.ref.media_kind:<24} {a.ref.size:>12} bytes  {a.links:>5} links",
    )


@assets_app.command("show")
def assets_show(
    ctx: typer.Context,
    digest: Annotated[str, typer.Argument(
        metavar="DIGEST", show_default=False, help="The asset's SHA-256 (64 lowercase hex characters).")],
    links: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Linking events to show.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """Show one asset: its catalog entries, its file, whether the file verifies, and the events linking it."""
    with open_store(ctx) as store:
        page = store.asset_entries(digest, limit=SHOWN_ENTRIES)
        entries = page.assets
        if not entries:
            raise AssetNotFoundError(f"no asset {digest} is catalogued; list them with `emelex memory assets list`")
        linked = store.asset_links(digest, limit=links)
        path = store.asset_dir / digest
        try:
            store.open_asset(entries[0].ref).close()
            verdict = "ok"
        except EmelexError as exc:
            verdict = str(exc)
    if as_json:
        echo_json("intact" if verdict == "ok" else "damaged", {
            "digest": digest,
            "file": str(path),
            "verified": verdict == "ok",
            "problem": None if verdict == "ok" else verdict,
            "entries": [_entry_dict(e) for e in entries],
            "more_entries": page.next_cursor is not None,
            "links": [{"session": x.session_id, "seq": x.seq, "ordinal": x.ordinal, "media_kind": x.media_kind}
                      for x in linked.links],
            "more_links": linked.next_cursor is not None,
        })
    else:
        typer.echo(f"Asset {digest}")
        typer.echo(f"  file:     {path}")
        typer.echo(f"  size:     {entries[0].ref.size} bytes")
        typer.echo(f"  verified: {verdict}")
        for e in entries:
            typer.echo(f"  entry:    {e.ref.media_kind}  {e.links} links  created {when(e.created_at)}  "
                       f"last used {when(e.touched_at)}")
        if page.next_cursor:
            typer.echo(f"  entry:    ... more than {len(entries)} media kinds; see `emelex memory assets list`")
        for x in linked.links:
            typer.echo(f"  linked:   Session {x.session_id} event #{x.seq} (asset {x.ordinal}, {x.media_kind})")
        if linked.next_cursor:
            typer.echo(f"  linked:   ... more than {len(linked.links)} events; show more with --links N")
    if verdict != "ok":
        raise typer.Exit(1)


@assets_app.command("verify")
def assets_verify(
    ctx: typer.Context,
    page_size: Annotated[int, typer.Option(
        "--page-size", metavar="N", callback=page_limit, help="Entries re-hashed per bounded page.")] = 500,
    max_assets: Annotated[Optional[int], typer.Option(
        "--max-assets", metavar="N", min=1, help="Stop after checking this many entries (default: all).")] = None,
    cursor: Annotated[Optional[str], typer.Option(
        metavar="CURSOR", help="Continue after this entry (printed if stopped early).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-hash every catalogued asset file, page by page, and report what is wrong; exit 1 if anything is.

    Text output prints each problem as its page is checked; `--json` lists
    the first 1000 problems and counts them all.
    """
    checked = hashed = found = 0
    listed: list[dict] = []
    with open_store(ctx) as store:
        while True:
            page = store.verify_assets(cursor=cursor, limit=page_size)
            checked, hashed, found = checked + page.checked, hashed + page.hashed_bytes, found + len(page.problems)
            for p in page.problems:
                if not as_json:
                    typer.echo(f"[FAIL] {p.digest} ({', '.join(p.media_kinds)}): {p.detail}")
                elif len(listed) < MAX_JSON_PROBLEMS:
                    listed.append({"digest": p.digest, "media_kinds": list(p.media_kinds), "detail": p.detail})
            cursor = page.next_cursor
            if cursor is None or (max_assets is not None and checked >= max_assets):
                break
    if as_json:
        echo_json("problems" if found else "intact", {
            "checked": checked,
            "hashed_bytes": hashed,
            "complete": cursor is None,
            "next_cursor": cursor,
            "problem_count": found,
            "problems": listed,
        })
    else:
        typer.echo(f"checked {checked} entries, {hashed} bytes hashed: "
                   f"{found} problem(s){'' if cursor is None else f'; stopped early, more after {cursor}'}")
    if found:
        raise typer.Exit(1)
