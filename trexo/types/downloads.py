"""A model's download on one node, as the node reports it (a fact in the cluster state)."""

from __future__ import annotations

import enum

import attrs


class DownloadPhase(enum.Enum):
    DOWNLOADING = "downloading"
    DONE = "done"
    """Every file this node needs of the model is on its disk."""
    RETRYING = "retrying"
    """The last attempt failed in a way that may pass (network down): trying again soon."""
    FAILED = "failed"
    """It cannot succeed as things stand (unknown repo, gated, no disk space, offline)."""
    CANCELLED = "cancelled"
    """No instance needs it any more; what was fetched stays, and a later one resumes."""


@attrs.frozen
class DownloadProgress:
    """One model's files on one node: how far, how fast, and what went wrong if anything."""

    model_id: str
    phase: DownloadPhase
    done_bytes: int = 0
    total_bytes: int = 0
    """Of the files this node needs (its shard's), including those already on disk."""
    bytes_per_s: float = 0.0
    eta_s: float | None = None
    error: str | None = None
    retry_in: float | None = None
    """Seconds until the next attempt (phase RETRYING)."""

    @property
    def fraction(self) -> float:
        return self.done_bytes / self.total_bytes if self.total_bytes > 0 else 0.0
