"""Disks that fail, for the tests of what the backend keeps: a tmpfs mounted here (read-only or
small), and one filled to its last byte. Mounting needs root: a test skips where it is refused."""

import contextlib
import os
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(folder: Path, options: str):
    """A fresh tmpfs at `folder` (made if missing) with mount `options`, unmounted afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fill(folder: Path) -> None:
    """Write zeros into `folder/filler` until its disk is full."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # full
        pass
    finally:
        os.close(fd)
