"""Disk-tier reads: exact bytes for any range, short reads resumed, errors retried then reported."""

import errno
import os

import numpy as np
import pytest

from hypura.profile.disk import fs_type
from hypura.tiers.direct_io import DirectReader, DiskReadError

SIZE = (3 << 20) + 12345  # not a multiple of the block size: the last block is partial


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dio") / "weights.bin"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    return path


def _read(reader, offset, nbytes):
    out = bytearray(nbytes)

    def sink(piece, at):
        out[at:at + len(piece)] = piece

    reader.read(offset, nbytes, sink)
    return bytes(out)


RANGES = [(0, 4096), (32, 100), (4095, 2), (5000, 1 << 20), (123457, (2 << 20) + 7), (SIZE - 777, 777), (0, SIZE)]


@pytest.mark.parametrize("offset,nbytes", RANGES)
def test_any_range_reads_exactly(data_file, offset, nbytes):
    expected = data_file.read_bytes()[offset:offset + nbytes]
    with DirectReader(data_file, request=256 << 10) as r:  # ranges span several requests
        assert _read(r, offset, nbytes) == expected


def test_uses_o_direct_on_disk_filesystems(data_file):
    kind = fs_type(data_file.parent)
    if kind not in ("ext4", "xfs", "btrfs"):
        pytest.skip(f"{kind}: O_DIRECT support varies")
    with DirectReader(data_file) as r:
        assert r.direct


def test_short_reads_are_resumed(data_file):
    calls = []

    def trickle(fd, bufs, offset):  # at most 3 blocks and a bit per call
        calls.append(offset)
        view = bufs[0][: 3 * 4096 + 100]
        return os.preadv(fd, [view], offset)

    with DirectReader(data_file, request=1 << 20, pread=trickle) as r:  # default retries: progress is no failure
        assert _read(r, 777, 500_000) == data_file.read_bytes()[777:500_777]
    assert len(calls) > 40


def test_transient_errors_are_retried(data_file):
    failures = {"left": 2}

    def flaky(fd, bufs, offset):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError(errno.EIO, "Input/output error")
        return os.preadv(fd, bufs, offset)

    with DirectReader(data_file, pread=flaky, retries=3) as r:
        assert _read(r, 10, 70_000) == data_file.read_bytes()[10:70_010]
    assert failures["left"] == 0


def test_persistent_errors_are_reported_with_the_place(data_file):
    def broken(fd, bufs, offset):
        raise OSError(errno.EIO, "Input/output error")

    with DirectReader(data_file, pread=broken, retries=2) as r:
        with pytest.raises(DiskReadError, match=r"reading \d+ bytes at 0 failed after 2 retries: Input/output error"):
            _read(r, 100, 10)


def test_a_file_that_ends_early_is_an_error(data_file):
    def truncated(fd, bufs, offset):  # the file shrank under us: reads return nothing
        return 0

    with DirectReader(data_file, pread=truncated, retries=2) as r:
        with pytest.raises(DiskReadError, match="keep returning nothing"):
            _read(r, 0, 4096)
    with DirectReader(data_file) as r:
        with pytest.raises(DiskReadError, match="past its end"):
            _read(r, SIZE - 10, 11)


def test_a_file_cut_within_a_block_is_an_error_not_a_spin(data_file):
    """Under O_DIRECT a file cut inside a block reads that block's first bytes on every retry: a read that
    rounds back to the block boundary made no progress (hypura-cli spun forever in test_truncation)."""
    def cut_within_a_block(fd, bufs, offset):  # the file now ends 100 bytes into the block read
        return 100

    with DirectReader(data_file, pread=cut_within_a_block, retries=2) as r:
        r.direct = True
        with pytest.raises(DiskReadError, match="keep returning nothing"):
            _read(r, 0, 8192)


def test_tmpfs_falls_back_to_buffered_reads(tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        pytest.skip("no /dev/shm on this machine")
    path = os.path.join(shm, f"hypura-dio-{os.getpid()}")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * 100)
    try:
        with DirectReader(path) as r:
            assert _read(r, 3, 1000) == (bytes(range(256)) * 100)[3:1003]
    finally:
        os.unlink(path)


def test_a_host_pool_tensor_is_read_as_spans_at_once(tmp_path, monkeypatch):
    """Transfers reads a streamed host tensor in `readers` spans on their own threads; every byte lands
    where the whole read would put it, at an unaligned offset too; a failing span raises."""
    import threading

    from hypura.runtime import transfers
    from hypura.runtime.transfers import Piece, Transfers

    monkeypatch.setattr(transfers, "STREAM_REQUEST_BYTES", 1 << 20)
    data = np.random.default_rng(1).integers(0, 256, 9 << 20, dtype=np.uint8).tobytes()
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    threads = set()

    def pread(fd, bufs, offset):
        threads.add(threading.get_ident())
        return os.preadv(fd, bufs, offset)

    monkeypatch.setattr(Transfers, "pread", staticmethod(pread))
    t = Transfers([str(path)], {}, False, readers=3)
    try:
        piece = Piece("t", None, "disk", 0, 4096 + 123, (7 << 20) + 5)
        whole = memoryview(bytearray(piece.nbytes))
        write = lambda at, got: whole.__setitem__(slice(at, at + len(got)), got)  # noqa: E731
        t._read_spans(piece, write)
        assert bytes(whole) == data[piece.file_offset:piece.file_offset + piece.nbytes] and len(threads) == 3

        def broken(fd, bufs, offset):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(Transfers, "pread", staticmethod(broken))
        for readers in t._readers.values():
            readers.close()  # the next reads open readers with the broken pread
        with pytest.raises(Exception, match="Input/output error|could not be read|I/O"):
            t._read_spans(piece, write)
    finally:
        t.close()
