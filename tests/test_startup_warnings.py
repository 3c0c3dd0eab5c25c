"""What `trexo run` warns about before it starts: exposure of the peer port, a slow BLAS."""

from __future__ import annotations

import pytest

from trexo.cli import main, startup_warnings
from trexo.config import NodeConfig, TransportConfig


def exposure(config: NodeConfig) -> list[str]:
    return [w for w in startup_warnings(config) if "cluster secret" in w]


def test_an_open_peer_port_without_a_secret_is_named_with_the_ways_to_close_it() -> None:
    (warning,) = exposure(NodeConfig(transport=TransportConfig(host="0.0.0.0", port=52416)))
    assert "0.0.0.0:52416" in warning
    for remedy in ("--cluster-secret", "--peer-host 127.0.0.1", "--no-multicast"):
        assert remedy in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "localhost"])
def test_a_loopback_peer_port_is_not_exposed(host: str) -> None:
    assert exposure(NodeConfig(transport=TransportConfig(host=host))) == []


def test_a_cluster_secret_closes_it() -> None:
    config = NodeConfig(transport=TransportConfig(host="0.0.0.0", secret=b"s3cret"))
    assert exposure(config) == []


def test_no_subcommand_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: trexo" in out and "run" in out and "demo-model" in out
