"""Every file popart_backend writes goes through here: paths confined to a folder, and atomic
replacement (a temporary file in the same folder, flushed and fsynced, then ``os.replace``), so
a failure midway leaves the old file whole and never a truncated one.

Plain functions over paths and bytes: any layer may import this module.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import popart_exception

__all__ = ["confined_path", "write_atomic", "write_bytes_atomic", "write_text_atomic"]


def confined_path(folder: str | os.PathLike, location: str, what: str) -> Path:
    """``folder / location`` resolved (symlinks included), refused unless it stays in ``folder``.

    ``what`` names the thing the path belongs to, for the message (e.g. "initializer 'w'").
    """
    root = Path(folder).resolve()
    if not location or os.path.isabs(location) or "\x00" in location:
        raise popart_exception(
            f"{what}: the file location {location!r} must be a non-empty path relative to the "
            f"folder '{root}'. Give a file name inside that folder."
        )
    target = (root / location).resolve()
    if target == root or not target.is_relative_to(root):
        raise popart_exception(
            f"{what}: the file location {location!r} resolves to '{target}', outside the folder "
            f"'{root}' (through '..' or a symbolic link). Files are read and written only inside "
            f"that folder; use a plain file name."
        )
    return target


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, then put it in ``path``'s place.

    The temporary file is fsynced before ``os.replace``; on any error it is removed and the old
    ``path`` (if any) is untouched. Returns the resolved path written. A symbolic link at
    ``path`` is replaced by the file, never followed.
    """
    target = Path(path)
    folder = target.parent.resolve()
    if not folder.is_dir():
        raise popart_exception(
            f"Cannot write '{path}': the folder '{folder}' does not exist. Create it first."
        )
    final = folder / target.name
    if final.is_dir():
        raise popart_exception(f"Cannot write '{path}': it is a folder. Give a file name.")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():
            # Keep the mode of the file being replaced (mkstemp creates 0600).
            os.chmod(tmp_name, final.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, final)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return final


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see ``write_atomic``)."""
    return write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see ``write_atomic``)."""
    return write_atomic(path, lambda f: f.write(text.encode(encoding)))
