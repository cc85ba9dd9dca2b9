"""Durable elastic state: the files rank 0 writes at ``State.commit()`` and reads back when a job starts again.

A checkpoint is one file, ``state-<commit number, 12 digits>.ckpt``: a fixed header, then the pickled state.
The header (big-endian) holds a magic, the format version, the commit's sequence number, the payload's length
and its sha256 digest, so a file cut short (a full disk, a machine lost while writing) or damaged later is
recognised and skipped for the previous one.

Writes are atomic: the bytes go to a temporary (hidden, ``.tmp``) name in the same directory, are flushed to
disk, then renamed to the final name, and the directory entry is flushed too. A final name therefore always
holds a complete file, and a temporary one never counts as a checkpoint.

Only rank 0 reads and writes these files; the other ranks get the state through ``State.sync()``, so the
directory need not be shared between hosts. The payload is a pickle: load checkpoints only from a directory
you trust, as loading runs code that the file names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import re
import struct
import tempfile
from typing import Any, List, Mapping, Optional, Tuple

from hvdlite.common.placement import log

MAGIC = b"HVDLCKPT"
FORMAT_VERSION = 1
HEADER = struct.Struct(">8sIQQ32s")  # magic, format version, sequence number, payload length, sha256 of payload
_FINAL_NAME = re.compile(r"^state-(\d+)\.ckpt$")
_TEMPORARY_PREFIX = ".state-"
_TEMPORARY_SUFFIX = ".tmp"

EVERY_DEFAULT = 1
KEEP_DEFAULT = 3


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used; the message says why."""


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """Where and how often ``State.commit()`` writes the state: every ``every``-th commit, keeping the newest
    ``keep`` files."""

    directory: str
    every: int = EVERY_DEFAULT
    keep: int = KEEP_DEFAULT

    def __post_init__(self):
        if self.every < 1:
            raise ValueError(f"checkpoint_every must be at least 1, got {self.every}")
        if self.keep < 1:
            raise ValueError(f"checkpoint_keep must be at least 1, got {self.keep}")

    @classmethod
    def resolve(
        cls,
        directory: Optional[str] = None,
        every: Optional[int] = None,
        keep: Optional[int] = None,
        environ: Optional[Mapping[str, str]] = None,
    ) -> Optional["CheckpointSettings"]:
        """The settings from the arguments of ``hvd.elastic.run``, each one that is not given from hvdlite-run's
        variables (HVDLITE_CHECKPOINT_DIR, _EVERY, _KEEP); None when no directory is set anywhere."""
        env = os.environ if environ is None else environ
        directory = directory or env.get("HVDLITE_CHECKPOINT_DIR")
        if not directory:
            return None
        if every is None:
            every = _whole_number(env, "HVDLITE_CHECKPOINT_EVERY", EVERY_DEFAULT)
        if keep is None:
            keep = _whole_number(env, "HVDLITE_CHECKPOINT_KEEP", KEEP_DEFAULT)
        return cls(os.fspath(directory), int(every), int(keep))


def _whole_number(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a whole number") from None


def path_for(directory: str, sequence: int) -> str:
    return os.path.join(directory, f"state-{sequence:012d}.ckpt")


def encode(sequence: int, payload: Any) -> bytes:
    body = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(MAGIC, FORMAT_VERSION, sequence, len(body), hashlib.sha256(body).digest()) + body


def decode(data: bytes) -> Tuple[int, Any]:
    """(sequence number, payload) of a checkpoint's bytes; CheckpointError says what is wrong with them."""
    if len(data) < HEADER.size:
        raise CheckpointError(f"truncated header: {len(data)} of {HEADER.size} bytes")
    magic, version, sequence, length, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError(f"not an hvdlite checkpoint (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"format version {version}; this hvdlite reads version {FORMAT_VERSION}")
    body = memoryview(data)[HEADER.size :]
    if len(body) != length:
        raise CheckpointError(
            f"payload of {len(body)} bytes where the header says {length}"
            + (" (truncated)" if len(body) < length else "")
        )
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError("sha256 digest of the payload does not match the header (corrupted)")
    try:
        return sequence, pickle.loads(body)
    except Exception as exc:  # a verified file that still cannot be unpickled: classes that changed or vanished
        raise CheckpointError(f"payload does not unpickle: {exc!r}") from None


def list_checkpoints(directory: str) -> List[Tuple[int, str]]:
    """(sequence number, path) of every file with a checkpoint's final name, newest first (not yet verified)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [
        (int(match.group(1)), os.path.join(directory, name))
        for name, match in ((name, _FINAL_NAME.match(name)) for name in names)
        if match
    ]
    return sorted(found, reverse=True)


def write(directory: str, sequence: int, payload: Any, keep: int) -> str:
    """Writes the checkpoint of commit ``sequence`` atomically, then deletes all but the newest ``keep``;
    returns its path."""
    os.makedirs(directory, exist_ok=True)
    data = encode(sequence, payload)
    final = path_for(directory, sequence)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=_TEMPORARY_PREFIX, suffix=_TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)  # the rename itself survives a crash of the machine only once this is done
    for _, older in list_checkpoints(directory)[keep:]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(older)
    return final


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partial_writes(directory: str) -> None:
    """Deletes the temporary files that a writer killed mid-write left behind (they never count)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(_TEMPORARY_PREFIX) and name.endswith(_TEMPORARY_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


def load_latest(directory: str) -> Optional[Tuple[int, Any, str]]:
    """(sequence number, payload, path) of the newest checkpoint that verifies; a damaged one is skipped for
    the one before it, with a warning that names the file and why. None when there is no usable one."""
    for sequence, path in list_checkpoints(directory):
        try:
            with open(path, "rb") as f:
                found, payload = decode(f.read())
            if found != sequence:
                raise CheckpointError(f"its header says commit {found}")
        except (CheckpointError, OSError) as exc:
            log("warning", f"checkpoint {path} is unusable ({exc}); trying the one before it", 0)
            continue
        return sequence, payload, path
    return None
