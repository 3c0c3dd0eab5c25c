from __future__ import annotations

import json
from pathlib import Path

import attrs
import mlx_lm
import pytest
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer
from mlx_lm.utils import get_total_parameters

from trexo.engine import demo_model
from trexo.engine.demo_model import (
    DEMO_MODEL_NAMES,
    DEMO_MODEL_SPECS,
    IM_END,
    VARIED_DEMO_SIZE,
    build_demo_model,
    demo_model_name,
    ensure_demo_model,
)


def file_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_builds_byte_identical_files(tmp_path: Path) -> None:
    first = file_bytes(build_demo_model(tmp_path / "a", "tiny", seed=3))
    second = file_bytes(build_demo_model(tmp_path / "b", "tiny", seed=3))
    assert set(first) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert first == second


def test_seed_changes_weights_not_tokenizer(tmp_path: Path, tiny_model: Path) -> None:
    other = build_demo_model(tmp_path / "s1", "tiny", seed=1)
    assert (other / "tokenizer.json").read_bytes() == (tiny_model / "tokenizer.json").read_bytes()
    assert (other / "model.safetensors").read_bytes() != (
        tiny_model / "model.safetensors"
    ).read_bytes()


def test_loads_with_mlx_lm_and_chat_template_works(tiny_model: Path) -> None:
    model, tokenizer = mlx_lm.load(str(tiny_model))
    assert get_total_parameters(model) == DEMO_MODEL_SPECS["tiny"].parameter_count
    assert tokenizer.eos_token == IM_END
    assert tokenizer.eos_token_ids == {tokenizer.convert_tokens_to_ids(IM_END)}
    assert isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer)
    messages = [{"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.decode(ids) == text
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_sizes_are_listed_with_their_shapes() -> None:
    assert set(DEMO_MODEL_NAMES) == {"tiny", "tiny-varied", "small", "tools", "thinking"}
    assert 0.8e6 < DEMO_MODEL_SPECS["tiny"].parameter_count < 0.9e6
    assert 19e6 < DEMO_MODEL_SPECS["small"].parameter_count < 21e6
    tiny, varied = DEMO_MODEL_SPECS["tiny"], DEMO_MODEL_SPECS[VARIED_DEMO_SIZE]
    assert attrs.evolve(varied, block_scale=1.0) == tiny  # the same shape: splits the same


def greedy_tokens(model_dir: Path, text: str, max_tokens: int) -> list[int]:
    model, tokenizer = mlx_lm.load(str(model_dir))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    sampler = make_sampler(temp=0.0)
    return [
        r.token
        for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens, sampler=sampler)
    ]


@pytest.mark.parametrize("text", ["What does the yield statement do?", "Tell me about with."])
def test_the_varied_model_does_not_repeat_itself(
    tmp_path: Path, tiny_model: Path, text: str
) -> None:
    varied = ensure_demo_model(tmp_path, VARIED_DEMO_SIZE)
    assert len(set(greedy_tokens(varied, text, 32))) >= 24
    assert len(set(greedy_tokens(tiny_model, text, 32))) <= 16  # why the variant exists


def test_only_the_varied_model_records_its_block_scale(tmp_path: Path, tiny_model: Path) -> None:
    varied = ensure_demo_model(tmp_path, VARIED_DEMO_SIZE)
    demo = json.loads((varied / "config.json").read_text())["trexo_demo"]
    assert demo["block_scale"] == DEMO_MODEL_SPECS[VARIED_DEMO_SIZE].block_scale
    assert "block_scale" not in json.loads((tiny_model / "config.json").read_text())["trexo_demo"]


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiny"):
        build_demo_model(tmp_path, "huge")


def test_names_carry_nonzero_seeds() -> None:
    assert demo_model_name("tiny") == "trexo-demo-tiny"
    assert demo_model_name("small", seed=7) == "trexo-demo-small-s7"


def count_builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    builds: list[Path] = []
    real = demo_model.build_demo_model

    def counting(dest: Path, size: str = "tiny", seed: int = 0) -> Path:
        builds.append(dest)
        return real(dest, size, seed)

    monkeypatch.setattr(demo_model, "build_demo_model", counting)
    return builds


def test_ensure_builds_once_then_reuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = count_builds(monkeypatch)
    path = ensure_demo_model(tmp_path, "tiny", seed=2)
    assert path == tmp_path / "trexo-demo-tiny-s2"
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_demo_model(tmp_path, "tiny", seed=2) == path
    assert len(builds) == 1
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left over


def test_ensure_survives_losing_a_publish_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = count_builds(monkeypatch)
    real = demo_model.build_demo_model

    def racing(dest: Path, size: str = "tiny", seed: int = 0) -> Path:
        real(dest, size, seed)
        if len(builds) == 1:  # a concurrent caller publishes while we are still building
            ensure_demo_model(tmp_path, size, seed)
        return dest

    monkeypatch.setattr(demo_model, "build_demo_model", racing)
    path = ensure_demo_model(tmp_path, "tiny", seed=4)
    assert len(builds) == 2
    assert (path / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
