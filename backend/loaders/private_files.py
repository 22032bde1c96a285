"""Folders and files of our caches that only this user can read.

The caches hold what users typed (the prefix cache: token ids and KV state of prompts)
and the weights converted from their models, so every folder the backend keeps them in
is 0700 and every file 0600, whatever the process umask: a folder is made (with any
missing parent) and then set to exactly that mode, an existing one with looser modes is
tightened, and one that belongs to another user is refused (NotPrivate), never used.
A file is written inside such a folder and set to 0600 before it is renamed into place,
so no other user can open it at any moment.
"""

import errno
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


class NotPrivate(OSError):
    """A cache folder this process must not use: another user owns it."""


def private_dir(path) -> Path:
    """`path` as a folder of this user's with mode 0700 (see the module's docstring).

    Raises NotPrivate for a folder of another user, NotADirectoryError when a file sits
    at `path`, and whatever mkdir raises (a read-only disk, a full one).
    """
    path = Path(path)
    missing = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)  # the umask may take bits off: set below
        except FileExistsError:
            continue  # another process made it meanwhile: checked like any existing one
        os.chmod(folder, DIR_MODE)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "a file, not a folder", str(path))
    if st.st_uid != os.geteuid():
        raise NotPrivate(errno.EPERM, f"belongs to uid {st.st_uid}, not to this process's uid {os.geteuid()}",
                         str(path))
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def private_file(path) -> None:
    """A file just written (in a private folder) becomes 0600 before anyone else is shown it."""
    os.chmod(path, FILE_MODE)


def open_private(path, flags: int = os.O_RDWR) -> int:
    """A descriptor of `path`, created 0600 when missing (a lock file)."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd
