"""``benchmarks/protocol_small_red.py`` can still put the blind warm-start choice back: the line it
replaces is in train/protocol.py once, and the copy it makes compiles with the blind rule in place."""

from __future__ import annotations

import py_compile


def test_the_blind_copy_replaces_the_probe_choice(load_benchmark, tmp_path):
    red = load_benchmark("protocol_small_red")
    commit = red.blind_copy(tmp_path)
    assert len(commit) == 40
    text = (tmp_path / "train" / "protocol.py").read_text()
    assert red.CHOICE not in text and text.count(red.BLIND) == 1
    py_compile.compile(str(tmp_path / "train" / "protocol.py"), doraise=True)
    assert (tmp_path / "benchmarks" / "reproduce_protocol.py").is_file()
