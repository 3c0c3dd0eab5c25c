"""Models the cluster can place."""

from __future__ import annotations

import attrs

DEMO_SOURCE_PREFIX = "demo:"
"""`source` of a built-in demo model: every node builds it locally, on demand."""


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


@attrs.frozen
class ModelRef:
    """A model by name, where to find its files, and how many bytes its weights take.

    `source` is `"demo:<size>"` for a built-in demo model or an absolute directory path
    (which must exist on the node that runs it).
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
