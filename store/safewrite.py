"""The one way aiscope writes a file at a path a user named: whole or not at all, never redirected.

A fixed temporary name beside the target (``<out>.tmp``) can be planted in advance as a symlink
by anyone who can write the directory, and opening it for writing follows the link: the review in
issue #27 made ``aiscope report --out r.html`` overwrite the file a planted ``r.html.tmp``
pointed to. So the temporary file gets a name nobody can predict, created by
:func:`tempfile.mkstemp` (``O_CREAT | O_EXCL | O_NOFOLLOW``: it fails rather than open anything
that is already there, a link included), in the target's own directory (so the final
:func:`os.replace` is a rename within one filesystem, atomic on POSIX and NFS), fsynced before the
rename, and removed on any failure. ``os.replace`` renames over the final name itself and never
follows a symlink standing there: the link is replaced, not its target.

Files holding telemetry of other users' processes (reports, analysis documents, segments) are
created :data:`PRIVATE_MODE` (0640) or what the umask allows, whichever is stricter. Importing
nothing of ours, this module is part of the store contract every room may use.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: Owner read-write, group read, others nothing: telemetry names other users' processes.
PRIVATE_MODE = 0o640
_CHUNK_BYTES = 1 << 20


def current_umask() -> int:
    """The process's umask (read by setting it and setting it back: POSIX offers no getter)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def effective_mode(mode: int = PRIVATE_MODE) -> int:
    """``mode`` narrowed by the umask: the stricter of the two for every permission bit."""
    return mode & ~current_umask() & 0o777


@contextlib.contextmanager
def atomic_open(target: Path, mode: int = PRIVATE_MODE) -> Iterator[BinaryIO]:
    """A binary file that becomes ``target`` when the block ends without an exception.

    The parent directory is created when missing. On an exception the temporary file is
    removed and ``target`` is left as it was (absent, or the previous version)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp: O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600, a random name. The leading dot
    # keeps readers that list a directory (segments) from ever seeing a half-written file.
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    temp = Path(temp_name)
    try:
        os.fchmod(fd, effective_mode(mode))
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise


def write_bytes(target: Path, data: bytes, mode: int = PRIVATE_MODE) -> Path:
    """Write ``data`` to ``target`` atomically, without following a planted link."""
    with atomic_open(target, mode) as handle:
        handle.write(data)
    return Path(target)


def write_text(target: Path, text: str, mode: int = PRIVATE_MODE) -> Path:
    """Write ``text`` (UTF-8) to ``target`` atomically, without following a planted link."""
    return write_bytes(target, text.encode("utf-8"), mode)


def copy_file(source: Path, target: Path, mode: int = PRIVATE_MODE) -> Path:
    """Copy the local file ``source`` to ``target`` atomically, in chunks."""
    with Path(source).open("rb") as src, atomic_open(target, mode) as dst:
        while chunk := src.read(_CHUNK_BYTES):
            dst.write(chunk)
    return Path(target)
