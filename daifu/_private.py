"""Files and directories only this user may use (control sockets, the code
cache, journals, logs): what daifu writes there can be code it runs later or
values of the program's variables."""

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


def open_private(path: str, purpose: str, error: type[Exception] = OSError,
                 flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                 sink: bool = False) -> int:
    """Open ``path`` (default: for appending, created with mode 0600) without
    following a symbolic link; refuse -- raising ``error`` with one line -- a
    file that belongs to another user or that others may write (it could be
    read or planted by them).  ``sink``: a file written and never read back
    (the log) may also be a character device or a FIFO, like a shell's
    ``>``.  Returns the fd."""
    flags |= getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if os.path.islink(path):
            reason = "it is a symbolic link"
        raise error(f"cannot open {purpose} {path}: {reason}") from None
    st = os.fstat(fd)
    problem = None
    if sink and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        return fd  # (``sink``: output only -- /dev/null, a terminal, a pipe -- never read back)
    if not stat.S_ISREG(st.st_mode):
        problem = "it is not a regular file"
    elif st.st_uid != os.getuid():
        problem = f"it belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    elif st.st_mode & 0o022:
        problem = (f"it has mode {stat.S_IMODE(st.st_mode):o}: others may write it "
                   f"(fix: chmod 600 {path})")
    if problem is not None:
        os.close(fd)
        raise error(f"refusing to use {purpose} {path}: {problem}")
    return fd


def check_file(path: str, purpose: str, error: type[Exception]) -> None:
    """Refuse, before anything is written, a file that ``open_private`` would
    refuse; a missing file needs a directory to be created in."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise error(f"cannot create {purpose} {path}: {parent} is not a directory") from None
        return
    if stat.S_ISLNK(st.st_mode):
        raise error(f"refusing to use {purpose} {path}: it is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise error(f"refusing to use {purpose} {path}: it is not a regular file")
    if st.st_uid != os.getuid():
        raise error(f"refusing to use {purpose} {path}: it belongs to uid {st.st_uid}, "
                    f"not to you (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise error(f"refusing to use {purpose} {path}: it has mode "
                    f"{stat.S_IMODE(st.st_mode):o}: others may write it (fix: chmod 600 {path})")
