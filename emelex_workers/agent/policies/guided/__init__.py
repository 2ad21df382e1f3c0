"""The "guided" turn policy: the rules that let a very small model (the embedded 135M default) get simple work done;
the rules every Session made with `emelex-tools/3` runs by.

On top of the narrowed policy's rules (paths narrowed to what exists, no call offered twice):

- the files the request names are read for the model and recorded with its input (`mentions`);
- an answer is one of the quotes of what was read (`quotes`), or, with nothing to quote, says it could not find it;
- a tool whose registered spec names `requested_by` verbs is offered only when a clause of the request begins with
  one, once per request, and alone while nothing has been read (`request.verbs`); a request that is only small talk
  offers no tool and is answered by rule;
- arguments the request spells out (`ToolSpec.request_spans`: a command, text to write) and a file's path are
  narrowed to what the request says (a command the program after its verb begins, the project's own test command
  for "run the tests", `projects`; a file the request names, wherever it is in the workspace, dotfiles too);
- the turn answers as soon as what it read holds the answer (forced "answered");
- (version 3) a request that names no file changes the file the previous answer quoted ("make it 3000"), and the
  text a change replaces ("held" spans) is one the Session read of the file (`held`).

All of it reads the request in English, by rule, from the recorded history alone, so a resumed turn is guided
exactly as the live one was.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from emelex_memory.agent.journal import REPEATED
from emelex_memory.agent.snapshot import ToolAuthority
from emelex_workers.host.notes import ContextNote, hit_file, note_files, split_quote
from emelex_workers.host.policies import TurnState, WorkspaceView
from emelex_workers.host.tools import bounded
from emelex_workers.host.types import ProposedCall

from ...protocol import PROTOCOL_V3
from ...schema import validate
from ..narrowed import NarrowedPolicy
from . import held, mentions
from .quotes import Quote, answers, choose, note_quotes, result_quotes
from .projects import project_tests
from .request import (
    SEEK_WORDS, asks_for, command_spans, mentioned, set_off, small_talk, small_talk_answer, spans, verbs, words,
)

_NOT_DONE = ("not_executed", REPEATED)  # outcomes that do not make a call "already done"
_NO_EFFECT = ("denied", "not_executed", REPEATED)  # outcomes of a call that cannot have changed the workspace
NOT_FOUND = "I could not find that in this workspace."  # the answer when nothing read holds one
INTERPRETERS = {".py": "python3", ".sh": "sh", ".js": "node", ".rb": "ruby", ".pl": "perl"}


class GuidedPolicy(NarrowedPolicy):
    """The small-model rules (see the module docstring); its Sessions run protocol `emelex-tools/3`."""

    name = "guided"
    version = 3  # 2: answers grounded (nothing to quote: NOT_FOUND), files named anywhere, project commands; 3: the
    # previous answer's file for a request naming none, "held" texts narrowed to what was read
    grounded = True  # with nothing to quote, the answer is NOT_FOUND (version 1: a free answer)
    finds_named = True  # a write or edit goes to the files the request named, dotfiles too (version 1: new paths
    # spelled out only)
    follows = True  # version 3: the previous answer's file, "held" texts (see the module docstring)
    summary = ("answers quote what was read; the files a message names are read for the model; a change or a run "
               "only when asked for with a verb")
    note_source = mentions.SOURCE

    def protocol(self, native: bool) -> str:
        """`emelex-tools/3`: a constrained JSON union whose system message asks for quoted answers."""
        return PROTOCOL_V3

    def at_version(self, version: int) -> GuidedPolicy | None:
        """This policy (version 3), or for a Session that recorded version 2 or 1 (or made before policies, with
        `emelex-tools/3`) the rules of that version (`GuidedPolicyV2`, `GuidedPolicyV1`), so that it resumes exactly
        as it ran."""
        return {self.version: self, 2: GuidedPolicyV2(), 1: GuidedPolicyV1()}.get(version)

    def turn_note(self, workspace: Path, request: str, walk: WorkspaceView) -> ContextNote | None:
        """The files the request names and the lines holding its rare words (`mentions.mentions_note`)."""
        return mentions.mentions_note(workspace, request, walk=walk, finds=self.finds_named)

    def offered(self, turn: TurnState) -> list[ToolAuthority]:
        """The enabled tools narrowed by what the request asks for (`_requested`): a tool whose registered spec
        names `requested_by` words only when the request asks for it, and only until one of its calls (or another
        such tool's) had an effect in the turn; while the turn has no result yet, none for a request that is only
        talk (`request.small_talk`: "hi", "thanks") or asks again about the previous answer (`_asks_again`), and
        when the request's first clause asks for such a tool, only those tools."""
        enabled = turn.enabled_tools()
        if not turn.results and (small_talk(turn.request) or self._asks_again(turn)):
            return []
        effects = {t.name for t in enabled if turn.spec(t.name).requested_by}
        requested = _requested(turn) & effects
        if _effected(turn):
            return [t for t in enabled if t.name not in effects]
        if not turn.results and (first := _requested(turn, first=True) & effects):
            return [t for t in enabled if t.name in first]
        return [t for t in enabled if t.name not in effects or t.name in requested]

    def arguments(self, turn: TurnState, tool: ToolAuthority) -> dict | None:
        """The narrowed policy's arguments (see `_named_paths`, `_spell_out`); in version 2, a tool that creates
        files ("new" paths) is left out when the only files it could write are existing files the request named
        (it would be refused without `replace`): the change is an edit; in version 3, a "held" argument narrowed to
        texts to replace (none of them "") is required, so the change replaces one instead of appending."""
        schema = super().arguments(turn, tool)
        if schema is None or not self.finds_named:
            return schema
        held_names = [name for name, kind in turn.spec(tool.name).request_spans.items() if kind == "held"]
        if self.follows and (must := [name for name in held_names if "" not in
                                      schema["properties"].get(name, {}).get("enum", [""])]):
            schema = {**schema, "required": list(dict.fromkeys([*schema.get("required", []), *must]))}
        noted = set(self._named(turn))
        for name, kind in turn.spec(tool.name).workspace_paths.items():
            enum = schema["properties"].get(name, {}).get("enum")
            if kind == "new" and enum and set(enum) <= noted:
                return None
        return schema

    def _named_paths(self, turn: TurnState, tool: ToolAuthority, kind: str, schema: dict, narrowed: dict) -> list[str]:
        """The files the request names, wherever they are in the workspace: those its context note read (recorded
        with the input: "my journal" is journal.txt, "utils.py" is src/pkg/utils.py, "the gitignore" is
        .gitignore) that the recorded `schema` admits, for a "new" path (a file written) or a "file" one (a file
        changed, by a tool the request asks for with a verb, `requested_by`); for a "new" path also the paths the
        request spells out that `narrowed` admits (a new file), unless a file it named has that name already."""
        if kind == "file" and not (self.finds_named and turn.spec(tool.name).requested_by) or \
                kind not in ("new", "file"):
            return []
        noted = [p for p in self._named(turn) if validate(p, schema) is None] if self.finds_named else []
        spelled = [p for p in mentioned(turn.request) if validate(p, narrowed) is None] if kind == "new" else []
        names = {path.rsplit("/", 1)[-1] for path in noted}
        spelled = [p for p in spelled if p in noted or p.rsplit("/", 1)[-1] not in names]  # "utils.py" is the one
        return list(dict.fromkeys(spelled + noted))

    def _named(self, turn: TurnState) -> list[str]:
        """The files the request names (those its context note read); in version 3, for a request that names none
        (no word of it may be a path, `request.mentioned`), the file the previous answer quoted ("src/app.js:3:
        ..." names src/app.js) when it is a workspace file: "make it 3000" changes what was just shown; else the
        files whose lines the note found holding the most of the request's rare words ("change the default port"
        goes to the file whose line holds "port")."""
        noted = note_files(turn.notes)
        if noted or not self.follows or mentioned(turn.request) or turn.walk is None:
            return noted
        label, text = split_quote(turn.previous)
        path = hit_file(label)
        if text and path in turn.walk.entries().files:
            return [path]
        wanted, held_words = words(turn.request), {}
        for note in turn.notes:
            for line in note.get("hits", ()):
                if isinstance(line, str):
                    label, text = split_quote(line)
                    held_words.setdefault(hit_file(label), set()).update(words(text) & wanted)
        best = max(map(len, held_words.values()), default=0)
        return [path for path, found in held_words.items() if best and len(found) == best]

    def _asks_again(self, turn: TurnState) -> bool:
        """In version 3: whether the request is a question about the previous answer that names nothing of its own
        ("which file is it in?": no word but common ones and `request.SEEK_WORDS`, no verb asking for a tool) while
        that answer quoted a workspace file ("src/pkg/cleaner.py:5: def drop_empty_rows(rows):"); its answer is
        then that quote again, which names the file."""
        if not self.follows or turn.walk is None or words(turn.request) - SEEK_WORDS or _requested(turn):
            return False
        label, text = split_quote(turn.previous)
        return bool(text) and hit_file(label) in turn.walk.entries().files

    def _spells(self, turn: TurnState, tool: ToolAuthority) -> bool:
        return bool(turn.spec(tool.name).request_spans)

    def _spell_out(self, turn: TurnState, tool: ToolAuthority, properties: dict[str, dict], entries) -> None:
        """Each argument the tool's spec names in `request_spans` restricted to the spans of the request that fit
        its schema ("command": `request.spans`; "text": `request.set_off`), when any do."""
        for name, kind in turn.spec(tool.name).request_spans.items():
            if name in properties:
                files = frozenset(entries.files) if entries is not None else frozenset()
                script = lambda word: _interpreter(word, files)  # noqa: E731
                offered = set_off(turn.request) if kind != "command" else \
                    command_spans(turn.request, _program, script, turn.spec(tool.name).requested_by,
                                  project_tests(getattr(turn.walk, "workspace", None), files)) \
                    if self.finds_named else spans(turn.request, _program, script)
                fitting = [span for span in offered if validate(span, properties[name]) is None]
                if fitting:
                    properties[name] = {**properties[name], "enum": fitting}
        self._narrow_held(turn, tool, properties)

    def _narrow_held(self, turn: TurnState, tool: ToolAuthority, properties: dict[str, dict]) -> None:
        """In version 3, each "held" argument (the text a change replaces) restricted to the texts of the one file
        its path argument admits that the Session read (`held.held`), and each "text" argument the request set off
        nothing for to the values or objects `held.held` gives; unchanged while the path admits several files."""
        spans = turn.spec(tool.name).request_spans
        if not self.follows or "held" not in spans.values():
            return
        paths = [properties[name].get("enum") for name, kind in turn.spec(tool.name).workspace_paths.items()
                 if kind == "file" and name in properties]
        if len(paths) != 1 or not paths[0] or len(paths[0]) != 1:
            return
        path = paths[0][0]
        replaced, values = held.held(turn.request, path, held.read(turn, path))
        for name, kind in spans.items():
            if name not in properties:
                continue
            if kind == "held":
                fitting = [text for text in replaced if validate(text, properties[name]) is None]
                properties[name] = {**properties[name], "enum": fitting or [""]}
            elif kind == "text" and values and "enum" not in properties[name]:
                if fitting := [v for v in values if validate(v, properties[name]) is None]:
                    properties[name] = {**properties[name], "enum": fitting}

    def answers(self, turn: TurnState) -> list[str] | None:
        """The quotes of the turn's tool results and of the context notes recorded with its input most relevant to
        the request (`quotes.choose`), or, once a tool the request asks for (`requested_by`) ran, of that tool's
        results only; before the turn's first result those of the notes and of earlier turns' results, only when
        one has a word of the request, `request.small_talk_answer` for a request that is only talk, and the previous
        answer for a request that asks again about it (`_asks_again`); when there is nothing to quote, only
        `NOT_FOUND`: an answer never states what nothing read holds."""
        if not turn.results and small_talk(turn.request):
            return [small_talk_answer(turn.request)]
        if not turn.results and self._asks_again(turn):
            return [turn.previous]
        chosen = choose(turn.request, _quotes(turn, self.follows), relevant_only=not turn.results,
                        named=note_files(turn.notes), declarations=self.finds_named)
        return chosen or ([NOT_FOUND] if self.grounded else None)

    def must_act(self, turn: TurnState) -> bool:
        """While the turn has no result yet and the request's first clause asks for a tool with `requested_by`
        words ("Create out.txt ..."), the round is the tool-call form alone, so the model does what was asked (the
        user still approves it) instead of answering that it did."""
        return not turn.results and bool(_requested(turn, first=True) & turn.enabled)

    def answered(self, turn: TurnState) -> bool:
        """Once the turn has a result: when a tool the request asks for (`requested_by`) ran (the answer then quotes
        its results only, and no such tool is offered again), or when the quotes the answer would choose among
        answer the request (`quotes.answers`)."""
        if not turn.results:
            return False
        return _effected(turn) or answers(turn.request, _quotes(turn, self.follows), note_files(turn.notes))


class GuidedPolicyV2(GuidedPolicy):
    """Version 2 of the guided rules, for the Sessions that recorded it: a request naming no file has no file to
    change, and the text an edit replaces is the model's own."""

    version = 2
    follows = False

    def at_version(self, version: int) -> GuidedPolicy | None:
        """Itself at version 2; else None."""
        return self if version == 2 else None


class GuidedPolicyV1(GuidedPolicy):
    """Version 1 of the guided rules, for the Sessions that recorded it: with nothing to quote, a free answer; a
    write's path narrowed only to new paths the request spells out; commands from the request's words alone; no
    dotfile named without its dot."""

    version = 1
    grounded = False
    finds_named = False
    follows = False

    def at_version(self, version: int) -> GuidedPolicy | None:
        """Itself at version 1; else None."""
        return self if version == 1 else None


def _requested(turn: TurnState, first: bool = False) -> set[str]:
    """The snapshot tools the user's request asks for: those whose registered `requested_by` words one of its
    clauses begins with (`request.verbs`, `request.asks_for`: one typo forgiven); with `first`, those its first
    clause begins with."""
    asked = verbs(turn.request)[:1] if first else verbs(turn.request)
    return {t.name for t in turn.snapshot.tools if asks_for(asked, turn.spec(t.name).requested_by)}


def _effected(turn: TurnState) -> bool:
    """Whether a call of a tool with `requested_by` words had an effect in the turn (any outcome but `denied`,
    `not_executed` and `repeated`)."""
    return any(turn.snapshot.tool(call.tool) is not None and turn.spec(call.tool).requested_by
               and result.get("outcome") not in _NO_EFFECT for call, result in turn.results)


def _quotes(turn: TurnState, unlabelled: bool = True) -> list[Quote]:
    """The quotes an answer is chosen among (`GuidedPolicy.answers`): of the results of the tools the request asks
    for that ran in the turn, when there are any; else of the turn's results (or, before it has any, of earlier
    turns' results) and of the context notes recorded with its input. With `unlabelled` (version 3), an output that
    begins with its quote's label ("notes.txt: appended ...") is quoted without it, so the label is said once."""
    done = [(call, result) for call, result in turn.results or turn.earlier
            if result.get("outcome") not in _NOT_DONE and isinstance(result.get("output"), str)]
    results = done if turn.results else []
    requested = _requested(turn)
    effects = [(call, result) for call, result in results
               if call.tool in requested and result.get("outcome") not in _NO_EFFECT]
    quotes = []
    for call, result in effects or done:
        outcome = result["outcome"]
        label = _label(turn, call) + ("" if outcome == "ok" else f" ({outcome})")
        output = result["output"]
        if unlabelled and output.startswith(f"{label}: "):
            output = output[len(label) + 2:]
        quotes += result_quotes(label, output, "" if effects else turn.request)  # an effect: no count
    if not effects:
        quotes += note_quotes(turn.notes, turn.request)
    return quotes


def _label(turn: TurnState, call: ProposedCall) -> str:
    """What a quote of `call`'s result is labelled with: the path of a declared "file" or "new" path argument (a
    file read, a file written), or of a "directory" one when it is the call's only string argument (a directory
    listed; "." as "./"); else the tool's name and its string arguments ("search_text pineapple",
    "run_command python3 greet.py"), so that only what a file holds is labelled with its path."""
    paths = turn.spec(call.tool).workspace_paths if turn.snapshot.tool(call.tool) is not None else {}
    strings = {name: v for name, v in call.arguments.items() if isinstance(v, str)}
    for name, kind in paths.items():
        if name in strings and (kind in ("file", "new") or len(strings) == 1):
            return "./" if strings[name] in (".", "") else strings[name]
    return bounded(" ".join([call.tool, *strings.values()]), 80)


def _program(word: str) -> bool:
    """Whether `word` names a program on PATH (a command starts with one)."""
    return "/" not in word and shutil.which(word) is not None


def _interpreter(word: str, files: frozenset[str]) -> str | None:
    """The interpreter that runs `word` when it is a script of `files` (workspace-relative paths) with a suffix of
    `INTERPRETERS` whose program is on PATH; else None."""
    interpreter = INTERPRETERS.get(os.path.splitext(word)[1])
    return interpreter if word in files and interpreter and shutil.which(interpreter) else None
