"""One schema: the steps are the .sql files in emelex_memory/core/schema/, and docs/schema.sql is what they build."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from emelex_memory.core import schema
from emelex_memory.core.migrations import MIGRATIONS
from emelex_memory.core.schema.reference import schema_text

DOCS_SCHEMA = Path(__file__).parents[2] / "docs" / "schema.sql"

# Every released step: its name (recorded in schema_migrations), whether it rebuilds tables, and the SHA-256 of its
# SQL. A store migrated by an earlier release must find exactly these, in this order; a new step is appended here.
RELEASED = [
    ("m001_core", False, "442a6768a172b1f0c2cb7efa4aabb15d8e203030973d647b8d1af54adbb257f3"),
    ("m002_assets", False, "bf38bb589c3568efcddee67dde52bda2dd73b51d264a47f1fa17309c7d725a02"),
    ("m003_jobs", False, "6f1778c8bbb863e61495ffceac65af2e89ff84ae64b078ddf0a00ebc97583f63"),
    ("m004_knowledge", False, "1ad10779f1d5e54ecef80337ad5322a72d971a17daccc9d51f7d6a20afb05fe2"),
    ("m005_model_refs", False, "d7f7cab7addcb5ed02692fc5e57767ac31765821a754dac8600df2a056fa4b42"),
    ("m006_summary_events", False, "f26d38c18a2a7d6844b5ceaf72350291f413b83980d1dc38705b774f5efaf305"),
    ("m007_event_byte_ends", False, "93df407b9c1e534fea31caa2477c42dc03859d0d042c599ff870595002077aec"),
    ("m008_event_media_ends", False, "52cff953ecd96b9c8b876eef89c0aab6131d3768910ac1269ecdaee339ab3399"),
    ("m009_workspaces", True, "16d82c45a829bbf3a9088ec5a4f269af6a38c05ca7e0265773007cdeec487d67"),
    ("m010_summary_reversions", False, "156fb47b2cd45dbaa2f940614d87b522c12005aa4e5bb57b294f1c622892de54"),
    ("m011_workspace_epochs_and_retirements", False, "294c798ea739def1e086f2e8867502f758564dacd9f29d5a041b21f9bff0d8ef"),
    ("m012_agent_journal", False, "d22ea401d52555c737e02f07717719de0045291a3a764c23603a3dbb101944e7"),
    ("m013_scale_indexes", False, "18d451b40f1b3ae9f0a39026d821cc6f15a1dcb80b9365888d9a56924a8b2c83"),
    ("m014_search_index", False, "9e759b9b0f52a0e2e006c1c8429fc7bf55f98525d343e0eff768e1e8a9453be1"),
]


def test_released_steps_are_unchanged() -> None:
    found = [(m.name, m.rebuilds_tables, hashlib.sha256(m.sql.encode("utf-8")).hexdigest()) for m in MIGRATIONS]
    assert found[: len(RELEASED)] == RELEASED


def test_docs_schema_is_generated_from_the_steps() -> None:
    assert DOCS_SCHEMA.read_text(encoding="utf-8") == schema_text(), (
        "docs/schema.sql is out of date: run `make schema`"
    )


@pytest.mark.parametrize("bad", [f"m{len(MIGRATIONS) + 2:03d}_gap.sql", "m002_duplicate_number.sql", "M014_Upper.sql"])
def test_a_misnumbered_step_file_is_refused(tmp_path: Path, bad: str) -> None:
    folder = tmp_path / "schema"
    shutil.copytree(schema.FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (folder / bad).write_text("SELECT 1;\n", encoding="utf-8")
    with pytest.raises(ValueError, match="is not step"):
        schema.steps(folder)
