"""The peer port file a node writes at start."""

from __future__ import annotations

from pathlib import Path

from trexo.peer_port_file import PEER_PORT_FILE, read_peer_port, write_peer_port


def test_the_last_start_s_port_is_read_back(tmp_path: Path) -> None:
    assert read_peer_port(tmp_path) is None
    write_peer_port(tmp_path, 41234)
    assert read_peer_port(tmp_path) == 41234
    write_peer_port(tmp_path, 50000)  # a restart replaces it
    assert read_peer_port(tmp_path) == 50000
    assert [p.name for p in tmp_path.iterdir()] == [PEER_PORT_FILE]  # no temporary left


def test_a_damaged_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / PEER_PORT_FILE).write_text("not a port")
    assert read_peer_port(tmp_path) is None
