"""The exception tree. Catch the narrowest class that fits; each says what went wrong."""

from __future__ import annotations

from trexo.config import API_RETRY_AFTER_S


class TrexoError(Exception):
    """Base of every error trexo raises on purpose."""


class WireError(TrexoError):
    """A message or frame on a socket could not be read."""


class FrameTooLarge(WireError):
    """A frame header announced a body larger than the configured maximum."""


class TruncatedFrame(WireError):
    """The stream ended in the middle of a frame."""


class MalformedMessage(WireError):
    """A frame's body is not valid JSON, or not a valid message of the expected type."""


class RunnerError(TrexoError):
    """A runner process failed, or refused a request."""


class RunnerUnavailable(RunnerError):
    """The runner cannot take work now: it died, or is being restarted. Retry shortly."""


class RunnerDied(RunnerUnavailable):
    """The runner process exited while work was in flight; `cause` says how."""

    def __init__(self, cause: str) -> None:
        super().__init__(f"runner exited: {cause}")
        self.cause = cause


class LoadFailed(RunnerError):
    """The runner could not load the model; `permanent` when loading again would fail the
    same way (see `trexo.runner.load_failure`)."""

    def __init__(self, message: str = "", *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class RequestRejected(RunnerError):
    """The runner refused a request as it stands (e.g. it does not fit the context)."""


class SupervisorGaveUp(TrexoError):
    """A supervised generation crashed more often than its restart intensity allows."""


class ClusterError(TrexoError):
    """A cluster operation could not be done; the API turns each kind into an HTTP error."""


class Unavailable(ClusterError):
    """Cannot be done right now; retry after `retry_after_s` (HTTP 503 + Retry-After)."""

    def __init__(self, message: str = "", retry_after_s: float = API_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NoSession(Unavailable):
    """There is no master right now (an election is running); retry shortly."""


class ModelNotFound(ClusterError):
    """No such model is known, or none is placed in the cluster."""


class InstanceNotFound(ClusterError):
    """No instance with that id."""


class NodeNotFound(ClusterError):
    """A command named a node that is not in the cluster."""


class TaskNotFound(ClusterError):
    """No generation with that id is in flight."""


class PlacementRefused(ClusterError):
    """The model cannot be placed (e.g. not enough memory); the message says why."""


class CommandRefused(ClusterError):
    """The master refused a command as invalid."""


class IdempotencyKeyReused(ClusterError):
    """The command's idempotency key was used before for a different request."""


class ModelLoadFailed(ClusterError):
    """The model's every instance failed to load in a way no retry mends (HTTP 500)."""


class GenerationFailed(ClusterError):
    """A generation ended in error for an unexpected reason."""


class GenerationRejected(ClusterError):
    """The request cannot be served as it is (e.g. it does not fit the model's context)."""


class ModelUnavailable(Unavailable):
    """The model is placed but cannot serve now (loading, or its runner restarting, or the
    session changed under the request); retry shortly."""


class HubError(TrexoError):
    """A model repository could not be resolved or fetched; each subclass says why."""

    retryable = False
    """Whether trying again later may succeed (the network came back)."""


class RepoNotFound(HubError, ModelNotFound):
    """No such repository or revision on the hub (or it is private and no token grants it)."""


class RepoAccessDenied(HubError, ClusterError):
    """The repository is gated (its terms must be accepted) or the token was refused."""


class HubUnreachable(HubError, Unavailable):
    """The hub could not be reached (network down, timeouts, server errors): retry later."""

    retryable = True


class NotOnDisk(HubError, ModelNotFound):
    """Offline, and files of the model are not on this node's disk."""


class NotAModel(HubError, CommandRefused):
    """The repository is not an mlx-lm model trexo can run (no config.json, no weights)."""


class UnsafeHubData(NotAModel):
    """The hub, or a repository on it, sent what no well-formed repository holds: a commit,
    hash or file name that is no safe path, JSON nested too deep or larger than the bound,
    a redirect loop. Refused whole, never retried. (Also a model reference whose commit is
    neither a commit hash nor a branch name.)"""


class NoDiskSpace(HubError, ClusterError):
    """The files do not fit the free space on the disk they go to (HTTP 507)."""


class CorruptDownload(HubError):
    """A downloaded file's size or hash differs from the hub's listing: fetched again."""

    retryable = True


class DownloadCrashed(HubError):
    """The download process ended without saying how (killed, out of memory): retried."""

    retryable = True


HUB_ERRORS: dict[str, type[HubError]] = {
    cls.__name__: cls
    for cls in (
        RepoNotFound,
        RepoAccessDenied,
        HubUnreachable,
        NotOnDisk,
        NotAModel,
        UnsafeHubData,
        NoDiskSpace,
        CorruptDownload,
        DownloadCrashed,
    )
}
"""By name, as a download process reports them."""


class LinkError(TrexoError):
    """A link to a peer node could not be set up."""


class PeerRefused(LinkError):
    """The handshake refused the link (namespace, version, secret, self-link); `reason` says why."""

    def __init__(self, reason: str, code: str = "refused", *, by_peer: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.by_peer = by_peer
        """True if the peer refused us; False if this node refused the peer."""


class DialFailed(LinkError):
    """The peer could not be reached, or the handshake broke off or did not finish in time."""


class SecureChannelError(TrexoError):
    """A link's encryption cannot go on (a message failed to open, nonces ran out): the link
    closes, and the peers link again."""


class TamperedMessage(SecureChannelError):
    """A sealed peer message failed authentication: tampered with, replayed, reordered,
    dropped before it, or sealed under other keys."""
