"""Installed models: the typed `InstalledModel`, its manifest and stamp on disk, validation, and the snapshot lock.

Layout under Emelex Home (directories 0700, files 0600, never followed through symlinks):

    <Home>/.snapshot-mutation.lock      the Home-wide snapshot-mutation lock (an exclusive flock)
    <Home>/models/<name>/manifest.json  canonical JSON: name, kind, file inventory with SHA-256s, origin
    <Home>/models/<name>/stamp.json     owned snapshots only: the snapshot ID and each file's stat identity
    <Home>/models/<name>/<file>.gguf    owned snapshots only: the private copy

An *owned* snapshot is a copy Emelex made; its stamp records the device,
inode, size, mtime and ctime of every file after it was hashed, so a later
write to the file (which moves ctime) breaks the stamp. File times are coarse
(a write within the same clock tick can leave ctime unchanged), so, as git
does for its index, a stamp taken less than two seconds after the file's
ctime is "racy": binding then re-hashes the file and, when it is intact,
writes a fresh stamp. A
*linked* snapshot records a target outside Home: its identity (canonical
path, device, inode), inventory (size, mtime) and full SHA-256, all
re-checked at every bind. The **snapshot ID** is the SHA-256 of the canonical
manifest (exactly this installation); the **reference** `<name>@sha256:<hex>`
names the model's bytes and stays the same when the same file is installed
again under the same name.

A *served* snapshot has no files: its manifest records a model server
(base URL, model ID, the name of the environment variable holding the API
key, never the key) and a plugin talks to it. Its snapshot ID names that
record; what the server reports about the model it serves (its identity) is
checked by the plugin and recorded in a Session's snapshot, not here.

Nothing here imports llama.cpp or loads a model; plugins do that.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import re
import stat
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import tenacity

from ..errors import (
    InsecurePathError,
    InvalidInputError,
    InvalidModelError,
    ModelNotInstalledError,
    ModelTamperedError,
    SnapshotLockTimeoutError,
    UnsafeModelPathError,
)
from ..core.private_files import (
    check_home,
    check_private_dir,
    ensure_private_dir,
    fsync_dir,
    is_private_file,
    open_for_reading,
    open_private_file,
    write_private_file,
)
from ..core.io_errors import file_error, translating
from ..core.jsonbound import encode_canonical

MODELS_DIRNAME = "models"
LOCK_NAME = ".snapshot-mutation.lock"
MANIFEST_NAME = "manifest.json"
STAMP_NAME = "stamp.json"
MANIFEST_FORMAT = 2  # of the manifests written now: their snapshot ID leaves out when and from where (see snapshot_id_of)
LEGACY_MANIFEST_FORMAT = 1  # still read: its snapshot ID is the SHA-256 of the whole manifest, as it always was
STAMP_FORMAT = 1
NOT_IDENTITY = ("installed_at", "origin")  # manifest fields that say when and from where, not what, was installed
MAX_MANIFEST_BYTES = 64 * 1024
MAX_MODELS = 1000  # installed models one listing reads
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
GGUF_MAGIC = b"GGUF"
CHUNK = 1024 * 1024
_CONTENT_DOMAIN = b"emelex-model-content-v1\x00"
_HASH_CACHE: dict[tuple, str] = {}  # full-stat identity of a linked file -> its SHA-256, hashed in this process
_HASH_CACHE_MAX = 64
RACY_NS = 2_000_000_000  # a stat identity younger than this when recorded cannot vouch for the bytes

Kind = Literal["owned", "linked", "served"]


@dataclass(frozen=True)
class ModelFile:
    """One file of a model snapshot: its name (within the snapshot), byte size and lowercase SHA-256."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class LinkedTarget:
    """The identity and inventory recorded for a linked model file: canonical path, device, inode, size, mtime."""

    path: str
    device: int
    inode: int
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class ServedEndpoint:
    """Where a served model runs: the server's base URL (without a trailing `/v1`), the model ID the server knows it
    by, the name of the environment variable holding its API key (None: no key; the key itself is never stored),
    whether plain http to a host other than loopback was allowed, and the context window in tokens the user declared
    for a server that does not report one (0: none declared)."""

    url: str
    model_id: str
    api_key_env: str | None
    allow_insecure: bool
    context_window: int


@dataclass(frozen=True)
class InstalledModel:
    """A model installed under Emelex Home, as read from its manifest. Obtain one from `ModelManager`.

    Model binding accepts only this type, never a caller's path or name, and
    re-reads the manifest from disk to check that this value still describes
    the installed snapshot. `model_file` is the GGUF to load: the private copy
    of an owned snapshot, or the target of a linked one; a served model has
    no files (`files` is empty) and `model_file` is its manifest, while
    `server` says where it runs (None for the other kinds).
    """

    name: str
    kind: Kind
    home: Path
    directory: Path
    model_file: Path
    files: tuple[ModelFile, ...]
    snapshot_id: str
    reference: str
    installed_at: float
    origin: str
    target: LinkedTarget | None
    server: ServedEndpoint | None = None

    @property
    def size(self) -> int:
        """Total bytes of the snapshot's files."""
        return sum(f.size for f in self.files)


class SnapshotReferenceGuard(Protocol):
    """What model removal asks before deleting a snapshot, while holding the snapshot-mutation lock.

    A guard may also offer `check_name_removable(name)`, asked before removing
    a damaged model whose snapshot ID cannot be read; without it such a model
    is never removed.
    """

    def check_removable(self, model: InstalledModel) -> None:
        """Return when nothing retains a reference to `model`'s snapshot; raise `ModelInUseError` otherwise."""


# -- paths and the lock ---------------------------------------------------------------------------------


def models_dir(home: Path) -> Path:
    """`<home>/models`, where installed snapshots live (the bare path; access it through `models_root`)."""
    return home / MODELS_DIRNAME


def models_root(home: Path, *, create: bool = False) -> Path | None:
    """`<home>/models` once checked, without following symlinks, to be a private directory of yours under a
    private Home; every access to installed models goes through here.

    Returns None when it does not exist, unless `create` (then Home and it
    are created mode 0700). Raises `UnsafeModelPathError` for a symlink,
    another owner or a group/world-writable directory.
    """
    root = models_dir(home)
    try:
        check_home(home)
        if create:
            ensure_private_dir(home)
            ensure_private_dir(root)
        elif not os.path.lexists(root):
            return None
        check_private_dir(home)
        check_private_dir(root)
    except InsecurePathError as exc:
        raise UnsafeModelPathError(str(exc)) from None
    return root


def check_model_name(name: object) -> str:
    """Return `name` if it is a valid model name (1-64 of a-z, 0-9, '.', '_', '-', starting alphanumeric)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidInputError(
            "a model name is 1-64 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit; "
            f"got {name!r}"
        )
    return name


@contextmanager
def snapshot_mutation_lock(home: Path, *, timeout_s: float) -> Iterator[None]:
    """Hold the Home-wide snapshot-mutation lock (an exclusive flock on `<home>/.snapshot-mutation.lock`).

    Install, bind (through its database commit) and remove all take it, so a
    check and the mutation it guards cannot interleave across processes.
    Waits at most `timeout_s`, then raises `SnapshotLockTimeoutError`. A
    lock file that is a symlink or not a private regular file (or an unsafe
    Home) raises `UnsafeModelPathError`.
    """
    try:
        check_home(home)
        ensure_private_dir(home)
        fd = open_private_file(home / LOCK_NAME, os.O_RDWR)
    except InsecurePathError as exc:  # a model problem: the worker releases the job and stops
        raise UnsafeModelPathError(str(exc)) from None
    try:
        try:
            tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(BlockingIOError),
                stop=tenacity.stop_after_delay(timeout_s),
                wait=tenacity.wait_exponential(multiplier=0.005, max=0.1),
                reraise=True,
            )(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SnapshotLockTimeoutError(
                f"the snapshot-mutation lock {home / LOCK_NAME} stayed held for {timeout_s:g}s by another process; "
                "wait for it to finish, then retry"
            ) from None
        except OSError as exc:
            raise file_error(exc, home / LOCK_NAME, "locking it") from exc
        yield
    finally:
        os.close(fd)  # closing drops the flock


# -- hashing and reading files safely -------------------------------------------------------------------


def open_regular(path: Path, *, what: str) -> int:
    """Open an existing regular file read-only without following a symlink; return the fd.

    Opened non-blocking, so a FIFO or device planted at `path` is refused
    (`ModelTamperedError`) instead of blocking the open.
    """
    try:
        fd = open_for_reading(path)
    except FileNotFoundError:
        raise ModelTamperedError(f"{what} {path} is missing; remove and reinstall the model") from None
    except OSError as exc:
        if os.path.islink(path):
            raise ModelTamperedError(
                f"{what} {path} is a symlink; Emelex never follows them: reinstall the model"
            ) from None
        raise ModelTamperedError(f"{what} {path} cannot be opened ({exc.strerror}); reinstall the model") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelTamperedError(f"{what} {path} is not a regular file; reinstall the model")
    return fd


def hash_fd(fd: int) -> tuple[int, str]:
    """(bytes read, lowercase SHA-256) of an open file from offset 0."""
    digest, size, offset = hashlib.sha256(), 0, 0
    while chunk := os.pread(fd, CHUNK, offset):
        digest.update(chunk)
        size += len(chunk)
        offset += len(chunk)
    return size, digest.hexdigest()


def content_digest(files: Sequence[ModelFile]) -> str:
    """Domain-separated SHA-256 over the snapshot's file sizes and SHA-256s, in order: names its bytes, whatever
    the files are called (an owned copy is always `model.gguf`; a linked file keeps its name)."""
    inventory = [{"sha256": f.sha256, "size": f.size} for f in files]
    return hashlib.sha256(_CONTENT_DOMAIN + _canonical(inventory)).hexdigest()


def _canonical(value: object) -> bytes:
    return encode_canonical(value, max_bytes=MAX_MANIFEST_BYTES, max_depth=8, what="the model manifest")


def is_gguf(fd: int) -> bool:
    """True when the open file starts with the GGUF magic."""
    return os.pread(fd, 4, 0) == GGUF_MAGIC


# -- manifest and stamp -----------------------------------------------------------------------------------


def manifest_bytes(
    name: str, kind: Kind, files: Sequence[ModelFile], installed_at: float, origin: str, target: LinkedTarget | None
) -> bytes:
    """The canonical manifest of a snapshot (its ID: `snapshot_id_of`)."""
    return _canonical({
        "format": MANIFEST_FORMAT, "name": name, "kind": kind, "installed_at": installed_at, "origin": origin,
        "files": [{"name": f.name, "sha256": f.sha256, "size": f.size} for f in files],
        "target": None if target is None else {
            "path": target.path, "device": target.device, "inode": target.inode, "size": target.size,
            "mtime_ns": target.mtime_ns,
        },
    })


def snapshot_id_of(data: bytes) -> str:
    """The snapshot ID of the canonical manifest `data`: `sha256:` and the SHA-256 of the manifest without
    `NOT_IDENTITY`, so installing the same file again under the same name (another time, another source path)
    gives the same ID; for a manifest of `LEGACY_MANIFEST_FORMAT` the SHA-256 of all its bytes, so the IDs that
    existing stores recorded keep verifying."""
    value = json.loads(data)
    if value.get("format") == LEGACY_MANIFEST_FORMAT:
        return "sha256:" + hashlib.sha256(data).hexdigest()
    return "sha256:" + hashlib.sha256(_canonical({k: v for k, v in value.items() if k not in NOT_IDENTITY})).hexdigest()


def write_stamp(directory: Path, snapshot_id: str, names: Sequence[str]) -> None:
    """Write (atomically: temporary file, fsync, rename, fsync the directory) the stamp of an owned snapshot: its
    snapshot ID, when it was taken, and the stat identity (dev, ino, size, mtime, ctime) of each named file."""
    data = _canonical({
        "format": STAMP_FORMAT, "snapshot_id": snapshot_id, "stamped_at_ns": time.time_ns(),
        "files": [_identity(name, os.lstat(directory / name)) for name in names],
    })
    temp = directory / f".{STAMP_NAME}.{os.getpid()}.{time.monotonic_ns()}"
    write_private_file(temp, data)
    os.rename(temp, directory / STAMP_NAME)
    fsync_dir(directory)


def _identity(name: str, st: os.stat_result) -> dict[str, Any]:
    return {"name": name, "device": st.st_dev, "inode": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def read_private_json(path: Path, *, what: str) -> tuple[bytes, dict[str, Any]]:
    """Read a small private (0600, ours, not a symlink) JSON object file; return its bytes and value."""
    fd = open_regular(path, what=what)
    try:
        st = os.fstat(fd)
        if not is_private_file(st):
            raise ModelTamperedError(f"{what} {path} is not a mode-0600 file of yours; remove and reinstall the model")
        data = os.pread(fd, MAX_MANIFEST_BYTES + 1, 0)
    finally:
        os.close(fd)
    try:
        value = json.loads(data) if len(data) <= MAX_MANIFEST_BYTES else None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ModelTamperedError(f"{what} {path} is not a valid JSON object; remove and reinstall the model")
    return data, value


def _parse_manifest(home: Path, directory: Path, data: bytes, m: dict[str, Any]) -> InstalledModel:
    if m.get("kind") == "served":
        return _parse_served_manifest(home, directory, data, m)
    where = f"manifest of {directory}"
    try:
        if m["format"] not in (MANIFEST_FORMAT, LEGACY_MANIFEST_FORMAT) or m["kind"] not in ("owned", "linked") or m["name"] != directory.name:
            raise ValueError("format, kind or name")
        files = tuple(ModelFile(f["name"], f["size"], f["sha256"]) for f in m["files"])
        if len(files) != 1 or not all(_valid_file(f) for f in files):
            raise ValueError("file inventory")
        t = m["target"]
        target = None if t is None else LinkedTarget(t["path"], t["device"], t["inode"], t["size"], t["mtime_ns"])
        if (target is None) != (m["kind"] == "owned") or not isinstance(m["installed_at"], float):
            raise ValueError("target")
        if not isinstance(m["origin"], str):
            raise ValueError("origin")
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelTamperedError(f"{where} is malformed ({exc}); remove and reinstall the model") from None
    if _canonical(m) != data:
        raise ModelTamperedError(f"{where} is not in canonical form (edited by hand?); remove and reinstall the model")
    model_file = directory / files[0].name if target is None else Path(target.path)
    return InstalledModel(
        m["name"], m["kind"], home, directory, model_file, files, snapshot_id_of(data),
        f"{m['name']}@sha256:{content_digest(files)}", m["installed_at"], m["origin"], target,
    )


def _valid_file(f: ModelFile) -> bool:
    return (
        isinstance(f.name, str) and 0 < len(f.name) <= 255 and "/" not in f.name and f.name not in (".", "..")
        and f.name not in (MANIFEST_NAME, STAMP_NAME) and isinstance(f.size, int) and f.size > 0
        and isinstance(f.sha256, str) and re.fullmatch(r"[0-9a-f]{64}", f.sha256) is not None
    )


@translating("reading the installed model", lambda home, name: models_dir(home) / str(name))
def read_installed(home: Path, name: str) -> InstalledModel:
    """Read the installed model `name` from its manifest (no hashing); raise `ModelNotInstalledError` if absent."""
    check_model_name(name)
    root = models_root(home)
    if root is None or not os.path.lexists(root / name):
        raise ModelNotInstalledError(
            f"no model {name!r} is installed under {home}; see `emelex models list`, or `emelex models install`"
        )
    directory = root / name
    if not stat.S_ISDIR(os.lstat(directory).st_mode):  # a file or a symlink where a snapshot should be
        raise ModelTamperedError(
            f"model directory {directory} is not a directory (a file or a symlink): move {directory} out of {root}, "
            "then reinstall the model"
        )
    try:
        check_private_dir(directory)
    except InsecurePathError as exc:
        raise ModelTamperedError(f"model directory: {exc}") from None
    data, value = read_private_json(directory / MANIFEST_NAME, what="model manifest")
    return _parse_manifest(home, directory, data, value)


@translating("listing the installed models", lambda home: models_dir(home))
def installed_names(home: Path) -> list[str]:
    """Names of the entries under `<home>/models` that are named like a model, sorted; at most `MAX_MODELS`.

    An entry that is not a directory (a file, a symlink) is named too, so
    that reading it reports it as damaged instead of leaving it unseen.
    """
    root = models_root(home)
    if root is None:
        return []
    names = []
    with os.scandir(root) as entries:
        for entry in entries:
            if NAME_PATTERN.match(entry.name):
                names.append(entry.name)
                if len(names) > MAX_MODELS:
                    raise InvalidInputError(f"more than {MAX_MODELS} models are installed under {root}; remove some")
    return sorted(names)


# -- validation at bind -------------------------------------------------------------------------------------


@translating("validating the model", lambda model: getattr(model, "directory", "the model"))
def revalidate(model: InstalledModel) -> InstalledModel:
    """Re-read and fully validate an installed snapshot; return it as it is on disk now. Hold the lock.

    Checks that `model` is an `InstalledModel`, that its directory and
    manifest are intact and still describe the same snapshot ID, then either
    the owned snapshot's stamp (every file's stat identity) or the linked
    target's identity, inventory and full SHA-256. Raises
    `ModelNotInstalledError` when the snapshot was removed or replaced, and
    `ModelTamperedError` when anything no longer matches.
    """
    if type(model) is not InstalledModel:
        raise InvalidInputError(
            f"model binding accepts an InstalledModel from ModelManager, not a {type(model).__name__}"
        )
    current = read_installed(model.home, model.name)
    if current.snapshot_id != model.snapshot_id:
        raise ModelNotInstalledError(
            f"the snapshot {model.snapshot_id} of model {model.name!r} is no longer installed (now "
            f"{current.snapshot_id}); look the model up again"
        )
    if current.kind == "owned":
        _check_stamp(current)
    elif current.kind == "linked":
        _check_linked(current)
    return current  # a served snapshot has no files: its manifest is all there is to check


def _check_stamp(model: InstalledModel) -> None:
    _, stamp = read_private_json(model.directory / STAMP_NAME, what="model stamp")
    stamped_at = stamp.get("stamped_at_ns")
    if stamp.get("format") != STAMP_FORMAT or stamp.get("snapshot_id") != model.snapshot_id or not isinstance(
        stamped_at, int
    ):
        raise ModelTamperedError(
            f"the stamp of model {model.name!r} does not match its manifest; run `emelex models verify {model.name}`"
        )
    recorded = stamp.get("files")
    if not isinstance(recorded, list) or len(recorded) != len(model.files):
        raise ModelTamperedError(
            f"the stamp of model {model.name!r} is malformed; run `emelex models verify {model.name}`"
        )
    for f, expected in zip(model.files, recorded):
        path = model.directory / f.name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise ModelTamperedError(
                f"model file {path} is missing; remove and reinstall model {model.name!r}"
            ) from None
        if not is_private_file(st):
            raise ModelTamperedError(f"model file {path} is not a private regular file; reinstall model {model.name!r}")
        if st.st_size != f.size or _identity(f.name, st) != expected:
            raise ModelTamperedError(
                f"model file {path} changed since it was installed (size, times or inode differ from its stamp); "
                f"run `emelex models verify {model.name}` to re-hash it, or reinstall it"
            )
    if any(stamped_at - e["ctime_ns"] < RACY_NS for e in recorded):
        verify_owned_files(model)
        write_stamp(model.directory, model.snapshot_id, [f.name for f in model.files])


def verify_owned_files(model: InstalledModel) -> None:
    """Hash every file of an owned snapshot against its manifest; `ModelTamperedError` on any difference."""
    for f in model.files:
        path = model.directory / f.name
        fd = open_regular(path, what="model file")
        try:
            st = os.fstat(fd)
            if not is_private_file(st):
                raise ModelTamperedError(f"model file {path} is not a private file of yours; reinstall {model.name!r}")
            size, digest = hash_fd(fd)
        finally:
            os.close(fd)
        if (size, digest) != (f.size, f.sha256):
            raise ModelTamperedError(
                f"model file {path} no longer matches its manifest; remove and reinstall {model.name!r}"
            )


def _check_linked(model: InstalledModel) -> None:
    target, (f,) = model.target, model.files
    assert target is not None
    fd = open_regular(Path(target.path), what="linked model target")
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (target.device, target.inode):
            raise ModelTamperedError(
                f"linked model target {target.path} was replaced by another file; re-link it with "
                f"`emelex models remove {model.name}` then `emelex models install {target.path} --link`"
            )
        if (st.st_size, st.st_mtime_ns) != (target.size, target.mtime_ns) or st.st_size != f.size:
            raise ModelTamperedError(
                f"linked model target {target.path} changed (size or mtime differ from its inventory); re-link it"
            )
        key = (target.path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        digest = _HASH_CACHE.get(key)
        if digest is None:
            size, digest = hash_fd(fd)
            if size != f.size:
                raise ModelTamperedError(f"linked model target {target.path} changed size while it was hashed")
            if time.time_ns() - st.st_ctime_ns >= RACY_NS:  # only an identity older than a clock tick vouches
                if len(_HASH_CACHE) >= _HASH_CACHE_MAX:
                    _HASH_CACHE.clear()
                _HASH_CACHE[key] = digest
    finally:
        os.close(fd)
    if digest != f.sha256:
        raise ModelTamperedError(
            f"linked model target {target.path} no longer has the SHA-256 recorded at install; re-link it"
        )


# -- served models ----------------------------------------------------------------------------------------

_SERVED_DOMAIN = b"emelex-served-model-v1\x00"
MAX_MODEL_ID = 256
MAX_URL = 2048
MAX_CONTEXT_WINDOW = 1_048_576
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}\Z")


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and any loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_server_url(url: object, *, allow_insecure: bool) -> str:
    """Return the base URL of a model server in normal form, or raise `InvalidModelError` saying what to fix.

    Only http and https, with a host and no user name, password, query or
    fragment (an API key belongs in an environment variable: `--api-key-env`).
    Plain http only to loopback unless `allow_insecure`. A trailing `/` or
    `/v1` is dropped: the URL names the server, and `/v1/...` is appended.
    """
    if not isinstance(url, str) or not url or len(url) > MAX_URL or any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise InvalidModelError(f"a server URL is up to {MAX_URL} printable characters without spaces, like "
                                f"http://127.0.0.1:8080; got {str(url)[:80]!r}")
    try:  # a bracketed host that is not an IPv6 address fails already in urlsplit, the port only here
        parts = urllib.parse.urlsplit(url)
        host, _port = parts.hostname, parts.port
    except ValueError as exc:
        raise InvalidModelError(f"the server URL {url!r} is malformed ({exc}); give it like http://HOST:PORT") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidModelError(f"the server URL must start with http:// or https://, not {parts.scheme or url!r}")
    if not host:
        raise InvalidModelError(f"the server URL {url!r} names no host; give it like http://HOST:PORT")
    if parts.username is not None or parts.password is not None:
        raise InvalidModelError("the server URL must not hold a user name or password; put the API key in an "
                                "environment variable and name it with --api-key-env")
    if parts.query or parts.fragment:
        raise InvalidModelError(f"the server URL {url!r} must not have a query or fragment; give only the server's "
                                "base URL")
    if parts.scheme == "http" and not allow_insecure and not is_loopback_host(host):
        raise InvalidModelError(f"plain http to {host} would send prompts (and any API key) unencrypted: use "
                                "https://, or pass --allow-insecure for a network you trust")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc.lower(), path, "", ""))


def check_served_endpoint(endpoint: ServedEndpoint) -> ServedEndpoint:
    """Return `endpoint` with its URL in normal form once every field is valid; `InvalidModelError` otherwise."""
    model_id, env, window = endpoint.model_id, endpoint.api_key_env, endpoint.context_window
    if not isinstance(model_id, str) or not 0 < len(model_id) <= MAX_MODEL_ID or not model_id.isprintable():
        raise InvalidModelError(f"a model ID is 1-{MAX_MODEL_ID} printable characters, as the server lists it "
                                f"(GET /v1/models); got {str(model_id)[:80]!r}")
    if env is not None and (not isinstance(env, str) or not ENV_NAME_PATTERN.match(env)):
        raise InvalidModelError(f"--api-key-env takes the NAME of an environment variable (letters, digits, _), not "
                                f"the key; got {'a value' if isinstance(env, str) else repr(env)} that is no such name")
    if type(window) is not int or not 0 <= window <= MAX_CONTEXT_WINDOW:
        raise InvalidModelError(f"a context window is 1 to {MAX_CONTEXT_WINDOW} tokens (0: as the server reports); "
                                f"got {window!r}")
    if not isinstance(endpoint.allow_insecure, bool):
        raise InvalidModelError("allow_insecure must be true or false")
    url = check_server_url(endpoint.url, allow_insecure=endpoint.allow_insecure)
    return ServedEndpoint(url, model_id, env, endpoint.allow_insecure, window)


def served_reference(name: str, endpoint: ServedEndpoint) -> str:
    """`<name>@sha256:<hex>` of a served model: names its server URL and model ID (the same server and model added
    again under the same name has the same reference)."""
    digest = hashlib.sha256(_SERVED_DOMAIN + _canonical({"model_id": endpoint.model_id, "url": endpoint.url}))
    return f"{name}@sha256:{digest.hexdigest()}"


def served_manifest_bytes(name: str, endpoint: ServedEndpoint, installed_at: float) -> bytes:
    """The canonical manifest of a served model; its SHA-256 is the snapshot ID."""
    return _canonical({
        "format": MANIFEST_FORMAT, "name": name, "kind": "served", "installed_at": installed_at,
        "origin": endpoint.url, "files": [], "target": None,
        "server": {"url": endpoint.url, "model_id": endpoint.model_id, "api_key_env": endpoint.api_key_env,
                   "allow_insecure": endpoint.allow_insecure, "context_window": endpoint.context_window},
    })


def served_model(home: Path, directory: Path, data: bytes, endpoint: ServedEndpoint, installed_at: float
                 ) -> InstalledModel:
    """The `InstalledModel` a served manifest `data` (from `served_manifest_bytes`) describes."""
    return InstalledModel(
        directory.name, "served", home, directory, directory / MANIFEST_NAME, (),
        "sha256:" + hashlib.sha256(data).hexdigest(), served_reference(directory.name, endpoint), installed_at,
        endpoint.url, None, endpoint,
    )


def _parse_served_manifest(home: Path, directory: Path, data: bytes, m: dict[str, Any]) -> InstalledModel:
    where = f"manifest of {directory}"
    try:
        if m["format"] != MANIFEST_FORMAT or m["name"] != directory.name or m["files"] != [] or m["target"] is not None:
            raise ValueError("format, name, files or target")
        if set(m) != {"format", "name", "kind", "installed_at", "origin", "files", "target", "server"}:
            raise ValueError("fields")
        s = m["server"]
        endpoint = ServedEndpoint(s["url"], s["model_id"], s["api_key_env"], s["allow_insecure"], s["context_window"])
        if check_served_endpoint(endpoint) != endpoint or m["origin"] != endpoint.url:
            raise ValueError("server")
        if not isinstance(m["installed_at"], float):
            raise ValueError("installed_at")
    except (KeyError, TypeError, ValueError) as exc:  # InvalidModelError is a ValueError
        raise ModelTamperedError(f"{where} is malformed ({exc}); remove and add the served model again") from None
    if _canonical(m) != data:
        raise ModelTamperedError(f"{where} is not in canonical form (edited by hand?); remove and add the model again")
    return served_model(home, directory, data, endpoint, m["installed_at"])
