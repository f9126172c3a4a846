"""A model's first blocks as a GGUF of their own: what the CPU profile decodes, so that the rate it
measures is the rate of this model's tensor types and shapes, not a stand-in's.

The copy keeps every tensor outside the blocks and every metadata entry, with the block count (and any
per-block array) cut down. The output matrix is a hole (zeros: a matmul takes as long on them), and so are
the input embeddings of a dense model; an MoE model's are copied, since its routers choose experts from the
tokens' embeddings (from zeros every token takes the same experts, which then sit in the CPU's caches).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFValueType

from hypura.errors import HypuraError
from hypura.modelfile import KV, ModelHeader, read_kv
from hypura.modelfile.writer import TensorInfo, header_bytes

COPY_CHUNK = 64 << 20  # bytes a copy request moves where copy_file_range is refused


def _kvs(header: ModelHeader, kvs: Sequence[KV], blocks: int) -> list[KV]:
    """The file's metadata with `blocks` blocks: block_count, and every per-block array cut to that length."""
    n, count = header.n_layer, f"{header.arch}.block_count"
    out = []
    for kv in kvs:
        if kv.key == count:
            kv = KV(kv.key, blocks, kv.vtype)
        elif kv.vtype == GGUFValueType.ARRAY and kv.key.startswith(f"{header.arch}.") and len(kv.value) == n:
            kv = KV(kv.key, list(kv.value)[:blocks], kv.vtype, kv.sub_type)
        out.append(kv)
    return out


def write_slice(header: ModelHeader, blocks: int, path: Path) -> Path:
    """`header`'s model with only its first `blocks` blocks, at `path`."""
    if int(header.get("split.count", 1) or 1) > 1:
        raise HypuraError(f"{header.path.name} is split over several files")
    alignment = int(header.get("general.alignment", 32) or 32)
    kept = [t for t in header.tensors if t.layer < blocks]
    infos, at = [], 0
    for t in kept:
        infos.append(TensorInfo(t.name, tuple(reversed(t.shape)), GGMLQuantizationType(int(t.ggml_type)), at))
        at += -(-t.nbytes // alignment) * alignment
    head = header_bytes(_kvs(header, read_kv(header.path), blocks), infos, alignment)
    holes = {"output.weight"} | (set() if header.get("expert_count") else {"token_embd.weight"})
    with open(header.path, "rb") as src, open(path, "wb") as dst:
        dst.write(head)
        dst.truncate(len(head) + at)  # the holes stay holes
        for t, info in zip(kept, infos):
            if t.name not in holes:
                _copy(src.fileno(), dst.fileno(), t.offset, len(head) + info.offset, t.nbytes)
    return path


@contextlib.contextmanager
def slices(header: ModelHeader, counts: Sequence[int], folder: Path) -> Iterator[dict[int, Path]]:
    """{blocks: a slice of that many blocks} in `folder`, for the `with` block; removed after it."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {n: folder / f".hypura-profile-{os.getpid()}-{n}-{header.path.name}" for n in counts}
    try:
        yield {n: write_slice(header, n, p) for n, p in paths.items()}
    finally:
        for p in paths.values():
            p.unlink(missing_ok=True)


def _copy(src: int, dst: int, src_at: int, dst_at: int, n: int) -> None:
    """n bytes between files: in the kernel where it can (copy_file_range), else through a buffer."""
    while n > 0:
        try:
            done = os.copy_file_range(src, dst, n, src_at, dst_at)
        except (AttributeError, OSError) as e:
            if isinstance(e, OSError) and e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = os.pwrite(dst, os.pread(src, min(n, COPY_CHUNK), src_at), dst_at)
        if done <= 0:
            raise HypuraError(f"copying the model's blocks for the CPU profile stopped at byte {src_at}")
        n, src_at, dst_at = n - done, src_at + done, dst_at + done
