"""The command line as a user meets it."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import trio

from .harness import run_trexo

TIMEOUT_S = 120.0


def trexo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trexo", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def test_help_names_every_command_and_option() -> None:
    top = trexo("--help")
    assert top.returncode == 0
    assert "run" in top.stdout and "demo-model" in top.stdout
    run = trexo("run", "--help")
    for option in (
        "--model",
        "--no-model",
        "--api-host",
        "--api-port",
        "--data-dir",
        "--peer",
        "--cluster-secret",
        "--force-master",
    ):
        assert option in run.stdout


def test_demo_model_command_builds_identical_bytes(tmp_path: Path) -> None:
    first = trexo("demo-model", "--data-dir", str(tmp_path / "a"))
    second = trexo("demo-model", "--data-dir", str(tmp_path / "b"))
    assert first.returncode == second.returncode == 0, first.stderr
    a, b = Path(first.stdout.strip()), Path(second.stdout.strip())
    assert a.is_dir() and b.is_dir() and a != b
    assert digest(a) == digest(b)


def test_a_missing_model_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = trexo("run", "--model", str(tmp_path / "nowhere"), "--data-dir", str(tmp_path))
    assert result.returncode == 2
    assert "neither a model directory nor a Hugging Face repo id" in result.stderr


async def test_run_with_a_local_model_directory_serves_it(tmp_path: Path) -> None:
    built = Path(trexo("demo-model", "--data-dir", str(tmp_path / "build")).stdout.strip())
    model_dir = tmp_path / "my-model"
    shutil.copytree(built, model_dir)
    async with run_trexo(tmp_path / "node", "--model", str(model_dir)) as node:
        client = openai.AsyncOpenAI(base_url=f"{node.url}/v1", api_key="x", max_retries=0)
        with trio.fail_after(TIMEOUT_S):
            models = await client.models.list()
            assert "my-model" in [m.id for m in models.data]
            reply = await client.chat.completions.create(
                model="my-model", messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
    assert reply.choices[0].message.content is not None
    assert reply.usage is not None and reply.usage.completion_tokens <= 5


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
async def test_the_printed_curl_works_verbatim(tmp_path: Path) -> None:
    async with run_trexo(tmp_path / "node") as node:
        stdout = (node.data_dir / "stdout.log").read_text()
        line = next(li for li in stdout.splitlines() if li.strip().startswith("try: curl"))
        command = shlex.split(line.strip().removeprefix("try: "))
        with trio.fail_after(TIMEOUT_S):
            done = await trio.run_process(command, capture_stdout=True, check=False)
    assert done.returncode == 0
    events = [e for e in done.stdout.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert len(events) > 2  # a role chunk, content, the finish: an answer streamed


def test_the_node_process_does_not_import_mlx_lm_at_start() -> None:
    # Importing the `mlx_lm` package sets the process's descriptor limits to (2048, 4096),
    # and fails where the hard limit is lower: a node started so died at import. Only its
    # runners, separate processes, load models.
    probe = (
        "import sys, trexo.cli, trexo.node; "
        "print(sorted(m for m in sys.modules if m.startswith('mlx')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
