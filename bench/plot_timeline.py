"""One decode token of `hypura bench --json` runs, drawn from the streamer's hook timeline: green
while a streamed layer waits for and computes its weights on the GPU (before -> after), blue between
streamed layers (the CPU's layers and the GPU's attention), grey before the first hook and after the
last. One strip per run, on one time scale.

    python bench/plot_timeline.py OUT.png RUN.json [RUN.json ...]
"""

import json
import sys
from pathlib import Path

import numpy as np

from hypura.plan.plot import draw_text, write_png

GREEN, BLUE, GREY, INK = (46, 160, 67), (31, 111, 235), (200, 200, 200), (30, 30, 30)
PX_PER_MS, LEFT, STRIP, GAP = 2.0, 170, 26, 22


def strip(img: np.ndarray, y: int, timeline: list) -> None:
    end = timeline[-1][2]
    img[y:y + STRIP, LEFT:LEFT + int(end * PX_PER_MS)] = GREY
    start = None
    last_after = None
    for kind, _layer, t in timeline:
        x = LEFT + int(t * PX_PER_MS)
        if kind == "before":
            if last_after is not None:
                img[y:y + STRIP, last_after:x] = BLUE
            start = x
        elif kind == "after" and start is not None:
            img[y:y + STRIP, start:max(x, start + 1)] = GREEN
            last_after = x


def main(out: str, runs: list[str]) -> None:
    data = [(Path(r).stem, json.loads(Path(r).read_text())) for r in runs]
    longest = max(d["stats"]["decode"]["last_call_timeline_ms"][-1][2] for _, d in data)
    width = LEFT + int(longest * PX_PER_MS) + 20
    img = np.full((40 + len(data) * (STRIP + GAP) + 30, width, 3), 255, dtype=np.uint8)
    draw_text(img, 8, 8, "one decode token: green streamed layer on gpu, blue cpu layers between, grey other")
    for i, (name, d) in enumerate(data):
        y = 36 + i * (STRIP + GAP)
        tl = d["stats"]["decode"]["last_call_timeline_ms"]
        draw_text(img, 8, y + 8, name.removeprefix("hypura-l70-")[:18])
        strip(img, y, tl)
        draw_text(img, LEFT + int(tl[-1][2] * PX_PER_MS) + 4 if tl[-1][2] * PX_PER_MS + 80 < width - LEFT else LEFT,
                  y + STRIP + 3, f"{tl[-1][2]:.0f} ms", scale=1)
    axis = 36 + len(data) * (STRIP + GAP)
    for ms in range(0, int(longest) + 1, 50):
        x = LEFT + int(ms * PX_PER_MS)
        img[axis:axis + 6, x] = INK
        draw_text(img, x - 6, axis + 9, f"{ms}", scale=1)
    write_png(out, img)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
