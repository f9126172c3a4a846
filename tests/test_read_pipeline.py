"""The pager's read pipeline: every range lands whole in its sink, errors surface after all requests report."""

import threading
import time

import numpy as np
import pytest

from hypura.tiers.direct_io import DirectReader, DiskReadError
from hypura.runtime.placement import TensorInfo, Tier
from hypura.runtime.read_pipeline import ReadPipeline

SIZE = (2 << 20) + 999


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipe") / "weights.bin"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    return path


def _part(offset, nbytes):
    return TensorInfo(name="t", ggml_type=0, shape=(nbytes,), file_offset=offset, nbytes=nbytes, file_idx=0,
                      layer=0, default_tier=Tier.HOST, default_buft="CPU")


def _parts_into(outs, ranges):
    def sink_for(out):
        def sink(piece, pos):
            out[pos:pos + len(piece)] = piece
        return sink

    return [(_part(o, n), sink_for(out)) for (o, n), out in zip(ranges, outs)]


RANGES = [(0, 4096), (33, 100_000), (4095, 2), (70_001, 300_000), (SIZE - 5000, 5000), (1 << 20, 1 << 20)]


def test_every_range_lands_whole_though_requests_land_out_of_order(data_file):
    data = data_file.read_bytes()
    pipe = ReadPipeline([str(data_file)], readers=3, request=16 << 10)  # many more requests than stagers
    try:
        for _ in range(2):  # stagers go back to the pool: a second run works alike
            outs = [bytearray(n) for _, n in RANGES]
            first = []
            pipe.run(_parts_into(outs, RANGES), before_first=lambda i: first.append((i, threading.current_thread())))
            assert sorted(first) == [(i, threading.current_thread()) for i in range(len(RANGES))]  # once a part
            assert [bytes(o) for o in outs] == [data[o:o + n] for o, n in RANGES]
    finally:
        pipe.close()


def test_preparers_finish_each_part_before_its_first_piece_lands(data_file):
    data = data_file.read_bytes()
    pipe = ReadPipeline([str(data_file)], readers=2, request=16 << 10, preparers=2)
    prepared, lock = {}, threading.Lock()

    def prepare(i):
        with lock:
            prepared[i] = prepared.get(i, 0) + 1

    def sinks(outs):  # each checks that its part was prepared before its bytes land
        def sink_for(i, out):
            def sink(piece, pos):
                assert prepared.get(i) == 1
                out[pos:pos + len(piece)] = piece
            return sink
        return [(_part(o, n), sink_for(i, out)) for i, ((o, n), out) in enumerate(zip(RANGES, outs))]

    try:
        outs = [bytearray(n) for _, n in RANGES]
        pipe.run(sinks(outs), before_first=prepare)
        assert prepared == dict.fromkeys(range(len(RANGES)), 1)
        assert [bytes(o) for o in outs] == [data[o:o + n] for o, n in RANGES]
    finally:
        pipe.close()


def test_a_failed_request_raises_after_all_report_and_the_pipeline_goes_on(data_file, monkeypatch):
    pipe = ReadPipeline([str(data_file)], readers=2, request=16 << 10)
    stage = DirectReader.stage

    def failing(self, start, want):
        if 100_000 <= start < 116_384:
            raise DiskReadError(f"{self.path}: injected failure at {start}")
        return stage(self, start, want)

    try:
        monkeypatch.setattr(DirectReader, "stage", failing)
        outs = [bytearray(n) for _, n in RANGES]
        with pytest.raises(DiskReadError, match="injected failure"):
            pipe.run(_parts_into(outs, RANGES))
        monkeypatch.undo()
        outs = [bytearray(n) for _, n in RANGES]
        pipe.run(_parts_into(outs, RANGES))  # every stager came back
        data = data_file.read_bytes()
        assert [bytes(o) for o in outs] == [data[o:o + n] for o, n in RANGES]
    finally:
        pipe.close()


def test_a_range_past_the_end_is_an_error(data_file):
    pipe = ReadPipeline([str(data_file)], readers=2)
    try:
        with pytest.raises(DiskReadError, match="past its end"):
            pipe.run(_parts_into([bytearray(10)], [(SIZE - 5, 10)]))
    finally:
        pipe.close()


def test_a_failing_sink_raises_and_every_stager_comes_back(data_file):
    pipe = ReadPipeline([str(data_file)], readers=2, request=16 << 10)

    def broken(piece, pos):
        raise RuntimeError("sink broke")

    try:
        with pytest.raises(RuntimeError, match="sink broke"):
            pipe.run([(_part(0, 1 << 20), broken)])
        out = bytearray(1 << 20)
        pipe.run(_parts_into([out], [(0, 1 << 20)]))
        assert bytes(out) == data_file.read_bytes()[: 1 << 20]
    finally:
        pipe.close()


def test_meanwhile_runs_before_any_copy_and_its_error_raises_after_every_request_reports(data_file):
    data = data_file.read_bytes()
    pipe = ReadPipeline([str(data_file)], readers=2, request=16 << 10)
    events = []

    def sink(piece, pos):
        events.append("copy")

    try:
        pipe.run([(_part(0, 1 << 20), sink)], before_first=lambda i: events.append("first"),
                 meanwhile=lambda: events.append("meanwhile"))
        assert events[:2] == ["meanwhile", "first"] and events.count("copy") == 64

        def broken():
            raise RuntimeError("eviction broke")

        with pytest.raises(RuntimeError, match="eviction broke"):
            pipe.run([(_part(0, 1 << 20), sink)], meanwhile=broken)
        out = bytearray(1 << 20)
        pipe.run(_parts_into([out], [(0, 1 << 20)]))  # every stager came back
        assert bytes(out) == data[: 1 << 20]
    finally:
        pipe.close()


def test_preparers_wait_for_meanwhile_before_any_before_first(data_file):
    """The pager evicts in meanwhile() and faults slices in in before_first: no fault-in may come before the room."""
    pipe = ReadPipeline([str(data_file)], readers=2, request=16 << 10, preparers=2)
    events, lock = [], threading.Lock()

    def note(event):
        with lock:
            events.append(event)

    def slow_room():
        time.sleep(0.05)  # the preparers are idle meanwhile: they would fault in now without the gate
        note("meanwhile done")

    try:
        pipe.run(_parts_into([bytearray(64 << 10) for _ in range(4)], [(i << 16, 64 << 10) for i in range(4)]),
                 before_first=lambda i: note(f"first {i}"), meanwhile=slow_room)
        assert events[0] == "meanwhile done" and sorted(events[1:]) == [f"first {i}" for i in range(4)]
        events.clear()

        def broken():
            raise RuntimeError("eviction broke")

        with pytest.raises(RuntimeError, match="eviction broke"):  # the preparers are released, not left waiting
            pipe.run(_parts_into([bytearray(64 << 10)], [(0, 64 << 10)]), before_first=lambda i: note("first"),
                     meanwhile=broken)
    finally:
        pipe.close()
