"""`inspect --plot`: placement by layer and tier as a PNG, drawn with numpy and written with zlib
(a stacked bar of bytes per tier for each block; a 3x5 pixel font for the labels)."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np

from hypura.plan.budget import fmt_size
from hypura.plan.cost import DISK, GPU, RAM
from hypura.plan.plan import Plan

COLORS = {GPU: (46, 160, 67), RAM: (31, 111, 235), DISK: (230, 126, 34)}
_BG, _INK, _GRID = (255, 255, 255), (30, 30, 30), (225, 225, 225)

# 3 columns x 5 rows per glyph, rows top to bottom
_FONT = {
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010", "P": "110101110100100",
    "Q": "010101101110011", "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111", "0": "111101101101111", "1": "010110010010111",
    "2": "111001111100111", "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001001001001", "8": "111101111101111", "9": "111101111001111",
    ".": "000000000000010", "-": "000000111000000", "/": "001001010100100", ":": "000010000010000",
    "(": "010100100100010", ")": "010001001001010", "_": "000000000000111",
}


def write_png(path: str | os.PathLike, rgb: np.ndarray) -> Path:
    """An 8-bit RGB PNG from an (height, width, 3) uint8 array."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + row.tobytes() for row in np.ascontiguousarray(rgb, dtype=np.uint8))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    path = Path(path)
    path.write_bytes(png)
    return path


def draw_text(img: np.ndarray, x: int, y: int, text: str, scale: int = 2, color=_INK) -> int:
    """Draw upper-cased text with its top-left at (x, y); returns the x after it."""
    for ch in text.upper():
        glyph = _FONT.get(ch)
        if glyph:
            bits = np.array([int(b) for b in glyph], dtype=bool).reshape(5, 3)
            block = np.kron(bits, np.ones((scale, scale), dtype=bool))
            region = img[y:y + block.shape[0], x:x + block.shape[1]]
            region[block[:region.shape[0], :region.shape[1]]] = color
        x += 4 * scale
    return x


def plot_plan(plan: Plan, path: str | os.PathLike) -> Path:
    rows = plan.layer_bytes()
    n = max(1, len(rows))
    bar = max(2, min(16, 960 // n))
    left, top, plot_h = 50, 60, 260
    width = left + n * bar + 20
    width = max(width, 420)
    img = np.full((top + plot_h + 40, width, 3), _BG, dtype=np.uint8)
    peak = max((sum(r.values()) for r in rows), default=1) or 1

    for frac in (0.25, 0.5, 0.75, 1.0):
        img[top + plot_h - int(frac * plot_h), left:left + n * bar] = _GRID
    for i, row in enumerate(rows):
        y = top + plot_h
        x0 = left + i * bar
        for tier in (GPU, RAM, DISK):  # stacked from the bottom: fastest tier lowest
            h = int(round(row[tier] / peak * plot_h))
            if h:
                img[y - h:y, x0:x0 + max(1, bar - 1)] = COLORS[tier]
                y -= h
    img[top:top + plot_h + 1, left - 1] = _INK
    img[top + plot_h, left - 1:left + n * bar] = _INK

    name = Path(plan.model).name.removesuffix(".gguf")
    draw_text(img, 8, 8, f"{name}  {plan.mode}  {plan.prediction.decode_tok_s:.2f} tok/s")
    x = 8
    for tier in (GPU, RAM, DISK):
        img[30:40, x:x + 10] = COLORS[tier]
        # each tier's weights in a unit that keeps its figures (47.8 MiB, not 0.0 GiB)
        x = draw_text(img, x + 14, 30, f"{tier} {fmt_size(plan.memory[tier]['weights'])}") + 16
    draw_text(img, 4, top - 14, "weights per layer")
    draw_text(img, 4, top, fmt_size(peak).replace(" ", ""))
    draw_text(img, left, top + plot_h + 8, "layer 0")
    last = f"{n - 1}"
    draw_text(img, left + n * bar - 8 * len(last), top + plot_h + 8, last)
    return write_png(path, img)
