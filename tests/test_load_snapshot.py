"""What every load hands llama.cpp (its model and context params, the devices, Hypura's fields, the plan) and what
`hypura inspect` prints, over tests/load_snapshot.py's matrix, is what tests/data/load_snapshot.json recorded: a
change to how a load is asked for or decided gives the GPU exactly what it gave before. A change that means to
place differently writes the snapshot again (`python tests/load_snapshot.py --write`) and says why."""

from __future__ import annotations

import json

import pytest

from load_snapshot import SNAPSHOT, snapshot


@pytest.mark.slow
def test_every_load_hands_llama_cpp_what_the_snapshot_recorded(tmp_path):
    want = json.loads(SNAPSHOT.read_text())
    got = json.loads(json.dumps(snapshot(tmp_path), sort_keys=True))
    assert sorted(got) == sorted(want)
    differ = [name for name in want if got[name] != want[name]]
    assert not differ, (f"{len(differ)} of {len(want)} cases differ, the first: {differ[0]}\n"
                        f"was: {json.dumps(want[differ[0]], sort_keys=True)[:3000]}\n"
                        f"now: {json.dumps(got[differ[0]], sort_keys=True)[:3000]}")
