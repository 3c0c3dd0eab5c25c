"""A module that stands around another in a model: what it lacks is the inner module's."""

from __future__ import annotations

from typing import Any, ClassVar

from mlx.nn.layers.base import Module


class Wrapping(Module):
    """Stands around the module kept under the key `INNER`; an attribute it does not have
    itself is the inner module's (a block's `use_sliding`, a projection's `weight`), so code
    that reads the model's attributes reads them through it."""

    INNER: ClassVar[str]

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if self.INNER not in self:  # still in __init__
                raise
            return getattr(self[self.INNER], name)
