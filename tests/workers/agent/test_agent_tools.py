"""Tools as plugins: the registry's checks, run_tool's bounds, and the built-in tools' workspace confinement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from emelex_memory import MemoryStore, PluginHookError
from emelex_workers.agent.tools import RegisteredTool, ToolInvocation, ToolOutput, ToolSpec, registered_tools, run_tool
from emelex_workers.hookspecs import hookimpl
from emelex_workers.host.manager import PluginInfo, get_plugin_manager
from emelex_workers.settings import WorkerSettings
from emelex_tools import command, files
from emelex_tools.plugin import tool_specs

from ...support import agent as agent_support
from ...support import file_state

BUILTIN = {spec.name: RegisteredTool(spec, "tools", "test") for spec in tool_specs()}


def call(tool: str, workspace: Path, store: MemoryStore | None = None, **arguments) -> ToolOutput:
    return run_tool(BUILTIN[tool], ToolInvocation("call-1", tool, arguments, workspace, store))


def manager(settings: WorkerSettings, *plugins: tuple[str, object]):
    pm = get_plugin_manager(settings)
    for name, plugin in plugins:
        pm.add_plugin(plugin, PluginInfo(name, f"dist-{name}", "1.0", name, False))
    return pm


class Registers:
    def __init__(self, *specs: object) -> None:
        self.specs = specs

    @hookimpl
    def register_tools(self, register) -> None:
        for spec in self.specs:
            register(spec)


def spec(name: str = "tool", **changes) -> ToolSpec:
    values = dict(name=name, description="A tool.", input_schema=agent_support.LABEL_SCHEMA,
                  run=agent_support.run_peek)
    values.update(changes)
    return ToolSpec(**values)


# -- the registry -------------------------------------------------------------------------------------------


def test_builtin_and_plugin_tools_are_registered_with_their_plugin_and_version(settings: WorkerSettings) -> None:
    pm = get_plugin_manager(settings)
    agent_support.add_to(pm)
    tools = registered_tools(pm)
    assert {"read_file", "list_dir", "search_text", "write_file", "run_command", "effect", "peek"} <= set(tools)
    assert tools["effect"].plugin == "agenttest" and tools["effect"].plugin_version == "0.1.0"
    assert tools["write_file"].spec.approval == tools["run_command"].spec.approval == "always"
    assert tools["read_file"].spec.approval == "never"
    authority = tools["effect"].authority()
    assert (authority.name, authority.approval, authority.plugin) == ("effect", "always", "agenttest")


def test_a_tool_name_registered_by_two_plugins_names_both(settings: WorkerSettings) -> None:
    pm = manager(settings, ("first", Registers(spec("read_file"))))
    with pytest.raises(PluginHookError) as info:
        registered_tools(pm)
    assert "'read_file'" in str(info.value) and "'tools'" in str(info.value) and "'first'" in str(info.value)


@pytest.mark.parametrize(("bad", "words"), [
    (spec("Read"), "does not match"),
    (spec("x" * 49), "does not match"),
    (spec("9lives"), "does not match"),
    (spec(description=""), "description"),
    (spec(description="d" * 1025), "description"),
    (spec(approval="sometimes"), "approval"),
    (spec(approval=True), "approval"),
    (spec(input_schema={"type": "object", "properties": {"p": {"type": "string"}}}), "maxLength"),
    (spec(input_schema={"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}), "minimum"),
    (spec(input_schema={"type": "string", "maxLength": 3}), "type"),
    (spec(input_schema={"type": "object", "properties": {"a": {"type": "array", "items": {"type": "boolean"}}}}),
     "maxItems"),
    (spec(max_output_bytes=0), "max_output_bytes"),
    (spec(workspace_paths={"label": "somewhere"}), "path kind"),
    (spec(workspace_paths={"path": "file"}), "not a string property"),
    (spec(workspace_paths=["label"]), "workspace_paths must be a mapping"),
    (spec(input_schema={"type": "object", "properties": {"n": {"type": "integer"}}}, workspace_paths={"n": "file"}),
     "not a string property"),
    (spec(requested_by={"run"}), "requested_by must be a frozenset"),
    (spec(requested_by=frozenset({"Run"})), "lowercase words"),
    (spec(request_spans={"label": "anything"}), "not a span kind"),
    (spec(request_spans={"path": "command"}), "not a string property"),
    (spec(request_spans=["label"]), "request_spans must be a mapping"),
    ("not a spec", "not a ToolSpec"),
])
def test_an_invalid_tool_spec_is_refused_naming_the_plugin(settings: WorkerSettings, bad: object, words: str) -> None:
    pm = manager(settings, ("sloppy", Registers(bad)))
    with pytest.raises(PluginHookError) as info:
        registered_tools(pm)
    assert "'sloppy'" in str(info.value) and words in str(info.value)


# -- run_tool -----------------------------------------------------------------------------------------------


def test_a_failing_tool_becomes_a_bounded_error_output(workspace: Path) -> None:
    def explode(invocation):
        raise ValueError("x" * 10_000)

    tool = RegisteredTool(spec(run=explode), "p", "1")
    out = run_tool(tool, ToolInvocation("c", "tool", {}, workspace))
    assert out.is_error and "ValueError" in out.text and len(out.text.encode()) <= 2048
    wrong = run_tool(RegisteredTool(spec(run=lambda invocation: "text"), "p", "1"), ToolInvocation("c", "t", {}, workspace))
    assert wrong.is_error and "not a ToolOutput" in wrong.text


def test_output_over_the_bound_becomes_a_content_addressed_asset(workspace: Path, store: MemoryStore) -> None:
    big = "line of output\n" * 1000
    tool = RegisteredTool(spec(run=lambda invocation: ToolOutput(big), max_output_bytes=1000), "p", "1")
    out = run_tool(tool, ToolInvocation("c", "tool", {}, workspace, store))
    assert not out.is_error and len(out.assets) == 1
    ref = out.assets[0]
    assert ref.size == len(big) and ref.media_kind == "text/plain" and f"sha256:{ref.digest}" in out.text
    assert len(out.text) < 1500
    assert store.read_asset(ref) == big.encode()
    no_store = run_tool(tool, ToolInvocation("c", "tool", {}, workspace, None))
    assert no_store.is_error and no_store.assets == () and "could not be stored" in no_store.text


# -- confinement --------------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path, workspace: Path) -> Path:
    """A workspace with a file, a subdirectory, and an outside secret reachable by symlinks."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET\n")
    (workspace / "notes.txt").write_text("hello\nneedle here\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "inner.txt").write_text("another needle\n")
    os.symlink(outside, workspace / "link_dir")
    os.symlink(outside / "secret.txt", workspace / "link_file")
    os.symlink("notes.txt", workspace / "inside_link")
    return workspace


def test_the_file_tools_read_list_and_search_inside_the_workspace(tree: Path) -> None:
    assert call("read_file", tree, path="notes.txt").text == "hello\nneedle here\n"
    assert call("read_file", tree, path="./sub//inner.txt").text == "another needle\n"
    listing = call("list_dir", tree, path=".").text
    assert "file 18 notes.txt" in listing and "dir" in listing and "symlink" in listing
    found = call("search_text", tree, text="needle").text
    assert "notes.txt:2: needle here" in found and "sub/inner.txt:1: another needle" in found
    assert "SECRET" not in call("search_text", tree, text="SECRET").text.replace("'SECRET'", "")


@pytest.mark.parametrize("path", [
    "../outside/secret.txt", "sub/../../outside/secret.txt", "/etc/passwd", "~/x", "link_dir/secret.txt",
    "link_file", "inside_link", "notes.txt/x", "a\0b",
])
def test_no_path_escapes_the_workspace(tree: Path, path: str) -> None:
    for tool, arguments in (("read_file", {"path": path}), ("list_dir", {"path": path}),
                            ("search_text", {"text": "SECRET", "path": path}),
                            ("write_file", {"path": path, "content": "pwned"})):
        out = call(tool, tree, **arguments)
        assert out.is_error and "SECRET" not in out.text.replace("'SECRET'", ""), (tool, out)
    assert (tree.parent / "outside" / "secret.txt").read_text() == "TOP SECRET\n"


def test_write_file_writes_atomically_and_changes_nothing_when_refused(tree: Path) -> None:
    out = call("write_file", tree, path="sub/new.txt", content="fresh")
    assert not out.is_error and (tree / "sub" / "new.txt").read_text() == "fresh"
    refused = call("write_file", tree, path="sub/new.txt", content="again")
    assert refused.is_error and "use edit_file, or set replace to true" in refused.text
    assert (tree / "sub" / "new.txt").read_text() == "fresh"
    assert not call("write_file", tree, path="sub/new.txt", content="again", replace=True).is_error
    assert (tree / "sub" / "new.txt").read_text() == "again"
    assert sorted(p.name for p in (tree / "sub").iterdir()) == ["inner.txt", "new.txt"]  # no temporary file left
    before = file_state(tree)
    assert call("write_file", tree, path="missing/new.txt", content="x").is_error
    assert call("write_file", tree, path="sub", content="x").is_error
    assert file_state(tree) == before


def test_a_directory_swapped_for_a_symlink_mid_path_is_refused(tree: Path, monkeypatch) -> None:
    """A check-then-open would be fooled by a swap between the check and the open; opening each component with
    O_NOFOLLOW relative to its parent is not: swap `sub` for a symlink right before the walk opens it."""
    real_open = os.open
    swapped = []

    def swapping_open(path, flags, *args, dir_fd=None, **kwargs):
        if path == "sub" and not swapped:
            swapped.append(True)
            os.rename(tree / "sub", tree / "sub_moved")
            os.symlink(tree.parent / "outside", tree / "sub")
        return real_open(path, flags, *args, dir_fd=dir_fd, **kwargs)

    monkeypatch.setattr(os, "open", swapping_open)
    out = call("read_file", tree, path="sub/secret.txt")
    assert swapped and out.is_error and "symlink" in out.text


def test_a_symlink_swapped_in_at_the_end_is_replaced_by_write_file_never_followed(tree: Path, monkeypatch) -> None:
    """Between write_file's check of the target and its rename, a symlink to an outside file appears."""
    real_rename = os.rename

    def swap_then_rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        os.symlink(tree.parent / "outside" / "secret.txt", "late", dir_fd=dst_dir_fd)
        return real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "rename", swap_then_rename)
    assert not call("write_file", tree, path="late", content="mine").is_error
    assert (tree.parent / "outside" / "secret.txt").read_text() == "TOP SECRET\n"
    assert not (tree / "late").is_symlink() and (tree / "late").read_text() == "mine"


def test_special_files_are_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "fifo")
    assert "not a regular file" in call("read_file", tree, path="fifo").text
    assert "fifo" in call("write_file", tree, path="fifo", content="x").text
    assert not call("search_text", tree, text="needle").is_error  # the FIFO is skipped, not opened for a read


def test_read_file_and_list_dir_are_bounded(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(files, "READ_CAP", 10)
    monkeypatch.setattr(files, "LIST_CAP", 2)
    assert call("read_file", tree, path="notes.txt").text.endswith("[read_file: showed the first 10 of 18 bytes]")
    assert "[list_dir: showed 2 of" in call("list_dir", tree, path=".").text


# -- run_command --------------------------------------------------------------------------------------------


def test_run_command_runs_in_the_workspace_and_reports_the_exit_code(tree: Path) -> None:
    out = call("run_command", tree, command="pwd; echo oops >&2; exit 3")
    assert out.is_error and out.text.startswith("exit code 3\n") and str(tree) in out.text and "oops" in out.text
    assert call("run_command", tree, command="cat notes.txt").text == "exit code 0\nhello\nneedle here\n"


def test_run_command_is_bounded_in_output_and_time(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(command, "OUTPUT_CAP", 1000)
    out = call("run_command", tree, command="head -c 50000 /dev/zero | tr '\\0' a")
    assert "kept the first 1000 of 50000 bytes" in out.text and len(out.text) < 1200
    result = command.run_command(ToolInvocation("c", "run_command", {"command": "sleep 30 & sleep 30"}, tree),
                                 timeout_s=0.2)
    assert result.is_error and result.text.startswith("timed out after 0.2 s")
