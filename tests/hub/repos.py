"""Model repositories for the fake hub, made from the demo models."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

TIED = "trexo-test/tiny-varied"
"""The varied demo model, its weights in 3 files: the embedding; layers 0-1; layers 2-3 and the
final norm (the head is tied to the embedding)."""
UNTIED = "trexo-test/tiny-untied"
"""The untied variant in 4 files: the embedding; layers 0-1; layers 2-3 and the norm; the head."""
GATED = "trexo-test/gated"
"""The varied model again, behind a token."""
BLOCK = re.compile(r"\.layers\.(\d+)\.")
INDEX = "model.safetensors.index.json"


def weight_file_of(tensor: str, layers_per_file: int) -> str:
    """The file a tensor goes to: the embedding alone, blocks in groups of
    `layers_per_file` (the last group with the final norm), the head alone."""
    if "embed_tokens" in tensor:
        return "model-embed.safetensors"
    if "lm_head" in tensor:
        return "model-head.safetensors"
    block = BLOCK.search(tensor)
    if block is None:  # the final norm goes with the last blocks
        return "model-blocks-last.safetensors"
    return f"model-blocks-{int(block.group(1)) // layers_per_file}.safetensors"


def split_repo(model_dir: Path, dest: Path, *, layers_per_file: int = 2) -> Path:
    """A copy of `model_dir` with its weights in several files and an index naming them,
    as large models are published: each rank of a pipeline then needs only some files."""
    import mlx.core as mx

    dest.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != INDEX:
            shutil.copy(path, dest / path.name)
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    n_layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    last_group = f"model-blocks-{(n_layers - 1) // layers_per_file}.safetensors"
    groups: dict[str, dict[str, mx.array]] = {}
    for name, array in weights.items():
        file = weight_file_of(name, layers_per_file).replace(
            "model-blocks-last.safetensors", last_group
        )
        groups.setdefault(file, {})[name] = array
    weight_map = {}
    for file, tensors in sorted(groups.items()):
        mx.save_safetensors(str(dest / file), tensors, metadata={"format": "mlx"})
        weight_map.update(dict.fromkeys(tensors, file))
    total = sum((dest / f).stat().st_size for f in groups)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dest / INDEX).write_text(json.dumps(index, indent=2))
    return dest
