"""A short list of popular mlx-community models, kept as data in the package (`curated.json`).

`/v1/models` lists them beside the demo models and what is on disk, so that a user sees what
can be placed by name. Their sizes are approximate until the model is resolved on the hub.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import attrs

from trexo.types.models import DEFAULT_HUB_REVISION, HubRevision, ModelRef

CURATED_FILE = "curated.json"


@attrs.frozen
class CuratedModel:
    model_id: str
    parameters: str
    quantization: str
    size_bytes: int
    """As published: approximate."""
    n_layers: int

    def model_ref(self) -> ModelRef:
        """Not yet resolved: placing it pins the hub's current commit first."""
        source = HubRevision(self.model_id, DEFAULT_HUB_REVISION).source
        return ModelRef(self.model_id, source, self.size_bytes)


@functools.cache
def curated_models() -> tuple[CuratedModel, ...]:
    raw = json.loads(resources.files("trexo.hub").joinpath(CURATED_FILE).read_text())
    return tuple(
        CuratedModel(
            m["id"], m["parameters"], m["quantization"], int(m["size_bytes"]), int(m["n_layers"])
        )
        for m in raw["models"]
    )


def curated(model_id: str) -> CuratedModel | None:
    return next((m for m in curated_models() if m.model_id == model_id), None)
