"""A model's JSON files from a hub are read bounded and by the hardened decoder: one nested
deep is a clear error where it is read (the node, the API's prompt counter, a runner's load),
never a `RecursionError`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trexo.engine.engine import Engine, _check_shard_files
from trexo.engine.prompt import read_context_length
from trexo.json_file import BadJsonFile, read_json_object
from trexo.types.shard import ShardSpec

DEEP = b'{"a":' * 20_000 + b"1" + b"}" * 20_000


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (DEEP, "nested deeper"),
        (b"[" * 20_000, "nested deeper"),
        (b"[1, 2]", "not a JSON object"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b" " * len(DEEP) + b"{}", "larger than"),
    ],
    ids=["deep", "unclosed", "array", "not-utf8", "too-large"],
)
def test_a_file_that_is_no_bounded_json_object_is_refused(
    tmp_path: Path, data: bytes, why: str
) -> None:
    path = write(tmp_path / "config.json", data)
    with pytest.raises(BadJsonFile, match=why) as refused:
        read_json_object(path, max_bytes=len(DEEP))
    assert "config.json" in str(refused.value)


def test_a_json_object_is_read(tmp_path: Path) -> None:
    path = write(tmp_path / "config.json", json.dumps({"max_position_embeddings": 4096}).encode())
    assert read_json_object(path) == {"max_position_embeddings": 4096}
    assert read_context_length(tmp_path) == 4096


def test_a_deep_config_has_no_context_length(tmp_path: Path) -> None:
    """The API's prompt counter reads it before every chat with the model."""
    write(tmp_path / "config.json", DEEP)
    assert read_context_length(tmp_path) is None


def test_a_runner_refuses_a_deep_config_or_index_with_a_clear_error(tmp_path: Path) -> None:
    model = tmp_path / "model"
    write(model / "config.json", DEEP)
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        Engine.load(model)
    write(model / "model.safetensors.index.json", DEEP)
    with pytest.raises(ValueError, match=r"index\.json is not valid JSON"):
        _check_shard_files(model, ShardSpec(start_layer=0, end_layer=1, world_size=2))
