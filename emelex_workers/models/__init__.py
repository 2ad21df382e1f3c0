"""The model manager (`manager`): install, link, verify and remove the model snapshots under Emelex Home, and the
embedded default model.

Imports emelex_memory and nothing else of emelex_workers. The names below are its public API.
"""

from .manager import (
    DEFAULT_MODEL_DISTRIBUTION,
    DEFAULT_MODEL_NAME,
    OWNED_FILE_NAME,
    STALE_TEMP_S,
    DamagedModel,
    ModelInventory,
    ModelManager,
    default_model_file,
    name_from_path,
)

__all__ = [
    "DEFAULT_MODEL_DISTRIBUTION", "DEFAULT_MODEL_NAME", "OWNED_FILE_NAME", "STALE_TEMP_S", "DamagedModel",
    "ModelInventory", "ModelManager", "default_model_file", "name_from_path",
]
