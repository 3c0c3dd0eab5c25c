"""Making a rename durable: what a crash-safe write needs beyond the file's own fsync."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """Flush `directory`'s entries (a file created or renamed in it) to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
