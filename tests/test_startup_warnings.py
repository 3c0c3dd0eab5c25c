"""What `trexo run` warns about before it starts (exposure of the peer port and the API, a slow
BLAS), and how it reads its API keys and TLS files."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
from tls_cert import make_self_signed

from trexo.cli import check_tls, main, read_api_keys, startup_warnings
from trexo.config import ApiConfig, NodeConfig, TransportConfig


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


def api_exposure(config: NodeConfig) -> list[str]:
    return [w for w in startup_warnings(config) if "the API listens" in w]


def test_an_api_beyond_loopback_without_a_key_is_named_with_the_ways_to_close_it() -> None:
    (warning,) = api_exposure(NodeConfig(api=ApiConfig(host="0.0.0.0", port=8000)))
    assert "0.0.0.0:8000" in warning and "no API key" in warning
    for remedy in ("--api-key", "TREXO_API_KEY", "--api-key-file"):
        assert remedy in warning


def test_a_keyed_api_beyond_loopback_without_tls_is_named_and_the_key_is_not() -> None:
    config = NodeConfig(api=ApiConfig(host="0.0.0.0", api_keys=("sk-secret",)))
    (warning,) = api_exposure(config)
    assert "without TLS" in warning and "--api-tls-cert" in warning
    assert "sk-secret" not in " ".join(startup_warnings(config))
    with_tls = attrs.evolve(config.api, tls_cert=Path("c.pem"), tls_key=Path("k.pem"))
    assert api_exposure(attrs.evolve(config, api=with_tls)) == []


def test_a_loopback_api_needs_no_key() -> None:
    assert api_exposure(NodeConfig()) == []


def test_keys_come_from_flags_the_file_and_the_environment(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# the team's keys\nsk-file-1\n\n  sk-file-2  \n")
    keys = read_api_keys(["sk-flag"], key_file, "sk-env")
    assert keys == ("sk-flag", "sk-file-1", "sk-file-2", "sk-env")
    assert read_api_keys([], None, None) == ()
    assert read_api_keys(["k", "k"], None, "k") == ("k",)
    (tmp_path / "empty").write_text("# none\n")
    for bad_file, problem in ((tmp_path / "empty", "no key"), (tmp_path / "nope", "cannot read")):
        with pytest.raises(ValueError, match=problem):
            read_api_keys([], bad_file, None)
    with pytest.raises(ValueError, match="blank"):
        read_api_keys(["  "], None, None)


def test_tls_options_go_together_and_are_checked_at_start(tmp_path: Path) -> None:
    assert check_tls(None, None) == (None, None)
    with pytest.raises(ValueError, match="go together"):
        check_tls(tmp_path / "c.pem", None)
    (tmp_path / "c.pem").write_text("not a certificate")
    with pytest.raises(ValueError, match=r"c\.pem"):
        check_tls(tmp_path / "c.pem", tmp_path / "c.pem")
    tls = make_self_signed(tmp_path / "tls")
    assert check_tls(tls.cert, tls.key) == (tls.cert, tls.key)


def test_a_bad_key_file_stops_trexo_run_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", "--data-dir", str(tmp_path), "--api-key-file", str(tmp_path / "missing")]
    assert main(args) == 2
    assert "--api-key-file" in capsys.readouterr().err
