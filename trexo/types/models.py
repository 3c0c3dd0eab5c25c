"""Models the cluster can place."""

from __future__ import annotations

import re

import attrs

DEMO_SOURCE_PREFIX = "demo:"
"""`source` of a built-in demo model: every node builds it locally, on demand."""
HUB_SOURCE_PREFIX = "hf:"
"""`source` of a Hugging Face model: `hf:<repo id>@<commit>`; every node fetches its part."""
DEFAULT_HUB_REVISION = "main"
COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")


@attrs.frozen
class TensorShape:
    """What decides whether a model splits by tensor over a number of ranks
    (`trexo.engine.tensor_shares.refusal`), from its `config.json`."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    widths: tuple[int, ...] = ()
    """Feed-forward widths split across the ranks."""
    group_size: int = 0
    """Quantization group (0: not quantized)."""
    even_only_because: str = ""
    """Why only an even split can be trusted (the shape is not fully known)."""
    latent_attention: bool = False
    """Multi-head latent attention (DeepSeek V3): every head reads one shared latent key
    and value, which every rank computes."""


@attrs.frozen
class ModelLayout:
    """The shape that decides how a model can be split (from its `config.json`)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    embedding_fraction: float = 0.0
    """Share of the weights in the embedding, which a pipeline's rank 0 holds besides its
    layers (0.0: not known)."""
    head_fraction: float = 0.0
    """Share of the weights in the final norm and the head, which a pipeline's last rank
    holds besides its layers; a head tied to the embedding counts the embedding again."""
    blocks_fraction: float = 1.0
    """Share of the weights in the blocks, split among a pipeline's ranks by their layers."""
    embedding_on_every_rank: bool = False
    """Every pipeline rank holds the embedding (gemma 4's blocks each read an input computed
    from the tokens)."""
    pipeline_cuts: tuple[int, ...] | None = None
    """The blocks before which a pipeline may cut, where the architecture limits them
    (`trexo.engine.pipeline_cuts`); None: before any block."""
    cuts_limited_because: str = ""
    """Why only `pipeline_cuts`."""
    tensor: TensorShape | None = None
    """What a tensor split must divide; None: not known (split evenly or not at all)."""


@attrs.frozen
class ModelRef:
    """A model by name, where to find its files, and how many bytes its weights take.

    `source` is `"demo:<size>"` for a built-in demo model, `"hf:<repo id>@<commit>"` for a
    Hugging Face model (pinned to the commit it was resolved to, so that every node fetches
    the same files), or an absolute directory path (which must exist on the node that runs
    it).
    """

    model_id: str
    source: str
    size_bytes: int
    created: int = 0
    """Unix time the model was made (OpenAI's `created`): stable across calls, nodes and
    restarts. A local model's `config.json` modification time; a fixed date for demo models."""
    layout: ModelLayout | None = None
    """None: not known (the model can only be placed whole)."""

    @property
    def demo_size(self) -> str | None:
        if self.source.startswith(DEMO_SOURCE_PREFIX):
            return self.source.removeprefix(DEMO_SOURCE_PREFIX)
        return None

    @property
    def hub_revision(self) -> HubRevision | None:
        """The repository and commit of a Hugging Face model; None for other sources."""
        if not self.source.startswith(HUB_SOURCE_PREFIX):
            return None
        repo_id, _, commit = self.source.removeprefix(HUB_SOURCE_PREFIX).rpartition("@")
        return HubRevision(repo_id, commit) if repo_id and commit else None

    @property
    def every_node_can_fetch(self) -> bool:
        """Any node can make its files (a demo model) or download them (a hub model)."""
        return self.demo_size is not None or self.hub_revision is not None


@attrs.frozen
class HubRevision:
    """A Hugging Face model repository at one commit."""

    repo_id: str
    commit: str
    """A commit hash once resolved; a branch or tag name before."""

    @property
    def source(self) -> str:
        return f"{HUB_SOURCE_PREFIX}{self.repo_id}@{self.commit}"

    @property
    def is_pinned(self) -> bool:
        """A commit hash, not a branch (`main`) that moves: a model is placed pinned."""
        return bool(COMMIT_HASH.match(self.commit))
