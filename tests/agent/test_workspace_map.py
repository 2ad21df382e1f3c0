"""The workspace map: top-level entries and a shallow tree with sizes, breadth first within its budget, no VCS or
cache directories, no symlink followed, plain JSON text whatever the file names."""

from __future__ import annotations

import json
import os
from pathlib import Path

from emelex_workers.agent.workspace_map import EMPTY, HEADER, MAP_CHARS, MORE, workspace_map


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_map_lists_entries_with_paths_relative_to_the_workspace_and_sizes(tmp_path: Path) -> None:
    tree(tmp_path, {"config.ini": "port = 8080\n", "src/app.py": "print(1)\n", "src/lib/util.py": "x = 1\n",
                    "README.md": "# hi\n"})
    (tmp_path / "logs").mkdir()
    made = workspace_map(tmp_path)
    assert made["text"] == "\n".join([
        HEADER,
        "README.md (5 bytes)",
        "config.ini (12 bytes)",
        "logs/ (empty)",
        "src/",
        "src/app.py (9 bytes)",
        "src/lib/",
        "src/lib/util.py (6 bytes)",
    ])
    assert made["entries"] == 7 and made["complete"] is True


def test_vcs_and_cache_directories_are_skipped_and_symlinks_never_followed(tmp_path: Path) -> None:
    outside = tree(tmp_path / "outside", {"secret.txt": "s"})
    root = tree(tmp_path / "ws", {".git/HEAD": "ref", "node_modules/x/index.js": "1", "__pycache__/a.pyc": "b",
                                  ".venv/bin/python": "", "a.txt": "a"})
    (root / "out").symlink_to(outside)
    (root / "file_link").symlink_to(outside / "secret.txt")
    text = workspace_map(root)["text"]
    assert text.splitlines()[1:] == ["a.txt (1 bytes)", "file_link (symlink)", "out (symlink)"]
    assert "secret" not in text and ".git" not in text and "node_modules" not in text


def test_a_deep_tree_stops_at_three_levels(tmp_path: Path) -> None:
    tree(tmp_path, {"a/b/c/d.txt": "d", "a/b/e.txt": "e"})
    made = workspace_map(tmp_path)
    assert made["text"].splitlines()[1:] == ["a/", "a/b/", "a/b/c/ (not listed)", "a/b/e.txt (1 bytes)", MORE]
    assert made["complete"] is False


def test_a_large_tree_keeps_the_top_level_first_within_the_budget(tmp_path: Path) -> None:
    tree(tmp_path, {f"pkg{i:02}/module{j:02}.py": "x" * j for i in range(20) for j in range(20)})
    tree(tmp_path, {f"top{i:02}.txt": "t" for i in range(10)})
    made = workspace_map(tmp_path)
    lines = made["text"].splitlines()
    assert len(made["text"]) <= MAP_CHARS and lines[-1] == MORE and made["complete"] is False
    assert {f"pkg{i:02}/" for i in range(20)} | {f"top{i:02}.txt (1 bytes)" for i in range(10)} <= set(lines)
    assert len(workspace_map(tmp_path, budget_chars=300)["text"]) <= 300


def test_an_empty_workspace_says_so(tmp_path: Path) -> None:
    assert workspace_map(tmp_path) == {"text": EMPTY, "entries": 0, "complete": True}


def test_a_name_that_is_not_utf8_still_makes_plain_json_text(tmp_path: Path) -> None:
    os.close(os.open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt"), os.O_CREAT | os.O_WRONLY))
    made = workspace_map(tmp_path)
    assert "caf\ufffd.txt (0 bytes)" in made["text"]
    assert json.loads(json.dumps(made, ensure_ascii=False)) == made
