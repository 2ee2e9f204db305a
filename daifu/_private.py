"""Directories only this user may use (control sockets, the code cache)."""

from __future__ import annotations

import os
import stat


def check_private(path: str, purpose: str, error: type[Exception]) -> None:
    """Raise ``error`` unless ``path`` is a real directory owned by this user
    that nobody else can read or write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise error(f"{path} does not exist") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise error(f"{path} is not a directory (symlink?); refusing to use it for {purpose}")
    if st.st_uid != os.getuid():
        raise error(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
                    f"refusing to use it for {purpose}")
    if st.st_mode & 0o077:
        raise error(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, readable or writable "
                    f"by others; refusing to use it for {purpose} (fix: chmod 700 {path})")
