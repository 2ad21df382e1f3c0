"""`emelex memory search WORDS...`: ranked hits in the workspace's live Knowledge and its Sessions' transcripts.

Each hit names what `knowledge show KEY` or `sessions show ID` takes: a Knowledge key and version, or a Session ID
prefix with the seq (range) and turn of the matching event.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .common import CursorOpt, JsonFlag, WorkspaceOpt, echo_page, open_store, page_limit

if TYPE_CHECKING:
    from emelex_memory import KnowledgeHit, SessionHit

SESSION_PREFIX = 8  # characters of a Session ID shown: `sessions show` takes any unique prefix of 4 or more
MAX_CONTEXT = 10  # neighbouring events shown at most on each side of a transcript hit
CONTEXT_CHARS = 200  # characters of a neighbouring event's text shown


def neighbours(store, hit: SessionHit, n: int) -> list[dict]:
    """The `n` stored events before and after a transcript hit's event (the raw history: replaced events too), each
    as its seq, kind and text (cut to 200 characters); the hit's own event left out."""
    from emelex_workers.host.types import event_body

    page = store.raw_events(hit.session_id, max(0, hit.seq - 1 - n), limit=2 * n + 1)
    out = []
    for raw in page.events:
        if raw.event.seq != hit.seq and abs(raw.event.seq - hit.seq) <= n:
            text = " ".join(event_body(raw.event).split())
            out.append({"seq": raw.event.seq, "kind": raw.event.kind,
                        "text": text if len(text) <= CONTEXT_CHARS else text[:CONTEXT_CHARS - 1] + "…"})
    return out


def hit_dict(hit: KnowledgeHit | SessionHit) -> dict:
    """A hit as plain JSON-ready data: its kind, citation, snippet and score."""
    from emelex_memory import KnowledgeHit

    if isinstance(hit, KnowledgeHit):
        return {"kind": hit.kind, "key": hit.key, "version": hit.version, "pinned": hit.pinned,
                "confidence": hit.confidence, "date": hit.date, "snippet": hit.snippet, "score": hit.score,
                "relevance": hit.relevance}
    return {"kind": hit.kind, "session": hit.session_id, "session_title": hit.session_title,
            "session_date": hit.session_date, "seq": hit.seq, "first_seq": hit.first_seq, "last_seq": hit.last_seq,
            "turn": hit.turn, "event_kind": hit.event_kind, "covered_by": hit.covered_by, "snippet": hit.snippet,
            "score": hit.score, "relevance": hit.relevance}


def hit_line(hit: KnowledgeHit | SessionHit) -> str:
    """One line per hit: where it is (what `knowledge show` / `sessions show` take; a key quoted as a shell would
    need it), then its snippet."""
    from emelex_memory import KnowledgeHit

    snippet = " ".join(hit.snippet.split())
    if isinstance(hit, KnowledgeHit):
        pinned = "  pinned" if hit.pinned else ""
        return (f"knowledge  {shlex.quote(hit.key)}  v{hit.version}  {hit.date}  conf {hit.confidence:.2f}{pinned}  "
                f"{snippet}")
    where = f"#{hit.first_seq}-#{hit.last_seq} (Summary #{hit.seq})" if hit.event_kind == "summary" else f"#{hit.seq}"
    replaced = f"  [replaced by Summary #{hit.covered_by}: sessions show --raw]" if hit.covered_by else ""
    title = f"  {shlex.quote(hit.session_title)}" if hit.session_title else ""
    return (f"session    {hit.session_id[:SESSION_PREFIX]}  {hit.session_date}{title}  {where}  turn {hit.turn}  "
            f"{hit.event_kind}  {snippet}{replaced}")


def search(
    ctx: typer.Context,
    query: Annotated[list[str], typer.Argument(metavar="WORDS...", show_default=False, help=(
        "Words to search for (any of them; best first; at most 32 distinct ones)."))],
    workspace: WorkspaceOpt = Path("."),
    knowledge: Annotated[bool, typer.Option("--knowledge", help="Search only Knowledge.")] = False,
    sessions: Annotated[bool, typer.Option("--sessions", help="Search only Session transcripts.")] = False,
    limit: Annotated[int, typer.Option(metavar="N", callback=page_limit, help="Hits per page.")] = 20,
    cursor: CursorOpt = None,
    context: Annotated[int, typer.Option(metavar="N", min=0, max=MAX_CONTEXT, help=(
        "Show the N events before and after each transcript hit (its neighbouring turns)."))] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Search the workspace's live Knowledge and its Sessions' transcripts; print ranked hits (one ranking, best
    first) with the key or Session ID prefix, date and seq that `knowledge show` and `sessions show` take. With an
    embedder set (EMELEX_EMBEDDER), the query's vector is fused with the full-text ranking."""
    if knowledge and sessions:
        raise typer.BadParameter("give --knowledge or --sessions, not both (neither searches both)")
    kinds = ("knowledge",) if knowledge else ("sessions",) if sessions else ("knowledge", "sessions")
    from emelex_workers.worker.embedding import embedder_of, query_vector

    with open_store(ctx) as store:
        text = " ".join(query)
        embedder = embedder_of(store.settings)
        try:
            fused = query_vector(embedder, store, workspace, text)
        finally:
            if embedder is not None and embedder.close is not None:
                embedder.close()
        page = store.search(workspace, text, kinds=kinds, limit=limit, cursor=cursor, **fused)
        around = {id(h): neighbours(store, h, context) for h in page.hits if context and h.kind == "sessions"}
    echo_page("hits", page.hits, page.next_cursor, as_json,
              as_dict=lambda h: {**hit_dict(h), **({"context": around[id(h)]} if id(h) in around else {})},
              line=lambda h: "\n".join([hit_line(h), *(f"    #{e['seq']} {e['kind']}: {e['text']}"
                                                        for e in around.get(id(h), []))]),
              empty="nothing found in this workspace")
