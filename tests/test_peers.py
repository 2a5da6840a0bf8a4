"""experiments/peers.py: clear errors without the optional peer packages or with bad options; with them installed, a
tiny side-by-side run prints one row per method."""

import importlib.util

import pytest

from experiments import peers


def test_missing_peer_packages_name_the_requirements_file(monkeypatch, capsys):
    monkeypatch.setattr(peers, "PEER_PACKAGES", ("no_such_peer_package",))
    with pytest.raises(SystemExit) as info:
        peers.main(["--repeats", "1"])
    assert info.value.code == 2 and "requirements-peers.txt" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--lengths", "100"], ["--methods", "full,flash"], ["--repeats", "0"]])
def test_bad_options_exit_2(argv):
    with pytest.raises(SystemExit) as info:
        peers.main(argv)
    assert info.value.code == 2


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in peers.PEER_PACKAGES),
    reason="optional: pip install -r requirements-peers.txt",
)
def test_tiny_side_by_side_run(capsys, tmp_path):
    assert peers.main(["--lengths", "128", "--repeats", "1", "--warmup-iters", "0", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert all(f"| {name} " in table for name in peers.PEERS)
    assert (tmp_path / "peers.md").read_text().strip() in table
