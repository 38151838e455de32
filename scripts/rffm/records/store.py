"""The results store: the results tree itself, a local directory or a Cloud Storage prefix.

Steps write their rule outputs through Snakemake (which uploads them under a storage provider).
What must outlive Snakemake's own bookkeeping is written here directly, create-only, by the store
itself: the test-split ledger, the selected artifacts, the memo of completed epochs and the launch
records. Snakemake never deletes these (they are no rule's outputs), and a second writer of the same
key never replaces the first: on a POSIX tree the bytes go to a temporary file that is hard-linked
into place (link(2) fails when the name exists, atomically, also on NFS); on Cloud Storage the
upload carries the precondition ifGenerationMatch=0, which the service enforces atomically.
"""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path
from typing import Any

from rffm.errors import ConfigError, IntegrityError
from rffm.records.files import atomic_write_bytes, sha256_bytes
from rffm.records.layout import profiling_folder


class Store:
    """Create-only keyed bytes under a root; keys are '/'-separated paths relative to the results root."""

    url: str

    def create(self, key: str, data: bytes) -> bool:
        """Write `data` under `key` unless the key exists; True when this call wrote it."""
        raise NotImplementedError

    def read(self, key: str) -> bytes | None:
        """The bytes under `key`, or None when there are none."""
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (a folder), sorted."""
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> None:
        """Write or replace `key` (only for diagnostics such as profiling traces)."""
        raise NotImplementedError

    def local_path(self, key: str) -> Path | None:
        """Where a key lives on this machine's filesystem, when the store is a directory."""
        return None

    def where(self, key: str) -> str:
        """The key's full address, for messages."""
        return f"{self.url.rstrip('/')}/{key}"

    def lock(self, key: str) -> bool:
        """Make an existing key write-once beyond what create-only gives, where the store allows it; True when it did."""
        return False

    def protection(self, key: str) -> str:
        """What keeps the bytes under `key` from being deleted or replaced, in words (for `rffm verify`)."""
        return "none known"


class PosixStore(Store):
    """A directory (the results tree): create-only by link(2)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.url = str(self.root)

    def local_path(self, key: str) -> Path:
        return self.root / key

    def create(self, key: str, data: bytes) -> bool:
        try:
            atomic_write_bytes(self.root / key, data, mode=0o444, create_only=True)
        except FileExistsError:
            return False
        return True

    def read(self, key: str) -> bytes | None:
        try:
            return (self.root / key).read_bytes()
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[str]:
        folder = self.root / prefix
        if not folder.is_dir():
            return []
        return sorted(
            path.relative_to(self.root).as_posix() for path in folder.rglob("*") if path.is_file() and not path.name.endswith(".tmp")
        )

    def put(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self.root / key, data)

    def lock(self, key: str) -> bool:
        """The file immutable (chattr +i): nobody deletes, renames or rewrites it until root clears the flag. Needs
        CAP_LINUX_IMMUTABLE (root outside a container's default capabilities) and a filesystem with the flag."""
        return set_immutable(self.root / key, True)

    def protection(self, key: str) -> str:
        path = self.root / key
        if inode_flags(path) & FS_IMMUTABLE_FL:
            return "immutable (chattr +i): no job can delete, rename or rewrite it"
        if path.stat().st_mode & 0o222 == 0:
            return "read-only (mode 0444) but not immutable: its owner, or root, can still delete it (concepts.md, the test ledger)"
        return "WRITABLE: any job can rewrite it (its mode was changed)"


# Linux inode flags (linux/fs.h): FS_IOC_GETFLAGS / FS_IOC_SETFLAGS take an int
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x00000010


def inode_flags(path: Path) -> int:
    """A file's inode flags (0 where the filesystem or the OS has none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, struct.pack("i", 0)))[0]
    except OSError:
        return 0
    finally:
        os.close(fd)


def set_immutable(path: Path, on: bool) -> bool:
    """Set or clear a file's immutable flag; True when the flag is now as asked (False: not allowed or not supported here)."""
    flags = inode_flags(path)
    wanted = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
    if wanted == flags:
        return bool(flags & FS_IMMUTABLE_FL) == on
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", wanted))
    except OSError:  # EPERM without CAP_LINUX_IMMUTABLE, ENOTTY/EOPNOTSUPP where the filesystem has no such flag
        return False
    finally:
        os.close(fd)
    return True


class GcsStore(Store):
    """A Cloud Storage prefix gs://bucket/prefix: create-only by the ifGenerationMatch=0 precondition."""

    def __init__(self, url: str, client=None):
        from google.cloud import storage

        bucket, _, prefix = url.removeprefix("gs://").partition("/")
        self.url, self.prefix = url.rstrip("/"), prefix.strip("/")
        self.client = client or storage.Client()
        self.bucket = self.client.bucket(bucket)

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def create(self, key: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            # the service checks the precondition atomically with the write (for resumable uploads too)
            self.bucket.blob(self._name(key)).upload_from_string(data, if_generation_match=0)
        except PreconditionFailed:
            return False
        return True

    def read(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self.bucket.blob(self._name(key)).download_as_bytes()
        except NotFound:
            return None

    def list(self, prefix: str) -> list[str]:
        from google.api_core.exceptions import NotFound

        start = len(self.prefix) + 1 if self.prefix else 0
        try:
            names = [blob.name for blob in self.client.list_blobs(self.bucket, prefix=self._name(prefix.rstrip("/") + "/"))]
        except NotFound:  # no bucket yet: nothing stored
            return []
        return sorted(name[start:] for name in names)

    def put(self, key: str, data: bytes) -> None:
        self.bucket.blob(self._name(key)).upload_from_string(data)

    def protection(self, key: str) -> str:
        """The object's retention and holds as the service reports them; else only IAM can keep jobs from deleting it."""
        blob = self.bucket.get_blob(self._name(key))
        if blob is None:
            return "missing"
        if blob.retention.mode:
            until = blob.retention.retain_until_time.isoformat() if blob.retention.retain_until_time else "?"
            return f"{blob.retention.mode} retention until {until} (Cloud Storage refuses its deletion until then)"
        holds = [name for name in ("temporary_hold", "event_based_hold") if getattr(blob, name)]
        if holds:
            return f"{' and '.join(holds).replace('_', ' ')}: Cloud Storage refuses its deletion while held"
        return (
            "created create-only (ifGenerationMatch=0), no retention or hold: whether a job can delete it is IAM's decision "
            "(`rffm preflight --profile gcp-batch` checks the VM account's roles; profiles/README.md, Write-once ledger)"
        )


def open_store(url: str | Path) -> Store:
    """The store a URL names: gs://bucket/prefix, or a directory."""
    text = str(url)
    if text.startswith("gs://"):
        return GcsStore(text)
    if "://" in text:
        raise ConfigError(f"results store {text}: only directories and gs:// prefixes are supported")
    return PosixStore(text)


def given_store(store: Store | str | Path | None, rule: str) -> Store:
    """The results store a step was handed (the rule passes --store); never guessed from its output folder."""
    if isinstance(store, Store):
        return store
    if not store:
        raise ConfigError(f"{rule}: no results store given. Fix: pass --store DIR|gs://bucket/prefix (the rule passes the configured one)")
    return open_store(store)


def create_addressed(store: Store, key: str, data: bytes, what: str) -> dict[str, Any]:
    """Create `key` (named by the sha256 of `data`) create-only; a key already there must hold those bytes: {key, bytes, sha256}."""
    digest = sha256_bytes(data)
    if not store.create(key, data) and sha256_bytes(store.read(key) or b"") != digest:
        raise IntegrityError(f"{store.where(key)}: does not hold the {what} its name promises. Fix: move it aside.")
    return {"key": key, "bytes": len(data), "sha256": digest}


def publish_trace(store: Store, run: str, trace: Path) -> str:
    """Put a Chrome trace (a diagnostic, never read back into a result) into a run's profiling folder."""
    key = f"{profiling_folder(run)}/{trace.name}"
    store.put(key, trace.read_bytes())
    return key
