"""A picture of the neuron-frequency distribution per layer, as a PNG written with numpy and zlib alone.

frequency_plot() draws, for every layer, its neurons' activation frequencies sorted from the most to the least
active (x: neuron rank as a fraction of n_ff, linear; y: frequency, log scale, one gridline per decade), one
curve per layer coloured from blue (layer 0) to red (the last layer). A power law shows as a steep head and a
long flat tail. Labels use a built-in 5x7 pixel font, so no plotting library or font file is needed.

write_png() is a minimal PNG encoder (8-bit RGB, filter 0 on every row, one IDAT chunk).
"""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np

W, H = 900, 560
LEFT, RIGHT, TOP, BOTTOM = 80, 120, 40, 60  # margins around the plot area, pixels
BG, AXIS, GRID, TEXT = (255, 255, 255), (40, 40, 40), (225, 225, 225), (20, 20, 20)

# 5x7 glyphs, one string of 7 rows of 5 bits per character (only the characters the labels use)
_FONT = {
    "0": "01110100011001110101110011000101110", "1": "00100011000010000100001000010001110",
    "2": "01110100010000100010001000100011111", "3": "11111000100010000010000011000101110",
    "4": "00010001100101010010111110001000010", "5": "11111100001111000001000011000101110",
    "6": "00110010001000011110100011000101110", "7": "11111000010001000100010000100001000",
    "8": "01110100011000101110100011000101110", "9": "01110100011000101111000010001001100",
    "-": "00000000000000011111000000000000000", ".": "00000000000000000000000000110001100",
    "e": "00000000000111010001111111000001110", " ": "0" * 35, "%": "11000110010001000100010001001100011",
    "(": "00010001000100001000010000010000010", ")": "01000001000001000010000100010001000",
    "A": "01110100011000111111100011000110001", "C": "01110100011000010000100001000101110",
    "E": "11111100001000011110100001000011111", "F": "11111100001000011110100001000010000",
    "I": "01110001000010000100001000010001110", "K": "10001100101010011000101001001010001",
    "L": "10000100001000010000100001000011111", "N": "10001100011100110101100111000110001",
    "O": "01110100011000110001100011000101110", "Q": "01110100011000110001101011001001101",
    "R": "11110100011000111110101001001010001", "T": "11111001000010000100001000010000100",
    "U": "10001100011000110001100011000101110", "Y": "10001100010101000100001000010000100",
    "V": "10001100011000110001100010101000100", "S": "01111100001000001110000010000111110",
    "P": "11110100011000111110100001000010000", "D": "11110100011000110001100011000111110",
    "G": "01110100011000010111100011000101111", "M": "10001110111010110101100011000110001",
    "B": "11110100011000111110100011000111110", "H": "10001100011000111111100011000110001",
    "W": "10001100011000110101101011010101010", "X": "10001100010101000100010101000110001",
    "Z": "11111000010001000100010001000011111", "J": "00111000100001000010000101001001100",
    "_": "00000000000000000000000000000011111", ":": "00000011000110000000011000110000000",
    ",": "00000000000000000000001100010001000",
}


def write_png(path: str | os.PathLike, rgb: np.ndarray) -> Path:
    """Write rgb uint8 [height, width, 3] as a PNG file (atomically)."""
    from ..convert.output import atomic_output

    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w, _ = rgb.shape
    raw = np.zeros((h, 1 + 3 * w), dtype=np.uint8)  # a leading 0 per row: filter type "none"
    raw[:, 1:] = rgb.reshape(h, -1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))
    path = Path(path)
    with atomic_output(path) as tmp:
        tmp.write_bytes(png)
    return path


def _text(img: np.ndarray, x: int, y: int, s: str, color=TEXT, scale: int = 1) -> None:
    """Draw s with its top-left corner at (x, y); unknown characters are left blank."""
    for k, ch in enumerate(s):
        glyph = _FONT.get(ch.upper() if ch.upper() in _FONT and ch not in _FONT else ch)
        if glyph is None:
            continue
        bits = np.array([int(b) for b in glyph], dtype=bool).reshape(7, 5)
        bits = np.kron(bits, np.ones((scale, scale), dtype=bool)).astype(bool)
        x0 = x + k * 6 * scale
        sub = img[y:y + bits.shape[0], x0:x0 + bits.shape[1]]
        sub[bits[:sub.shape[0], :sub.shape[1]]] = color


def _layer_color(i: int, n: int) -> tuple[int, int, int]:
    t = i / max(1, n - 1)
    return int(30 + 200 * t), int(60 + 60 * (1 - abs(2 * t - 1))), int(230 - 200 * t)


def frequency_plot(freqs: Sequence[np.ndarray], path: str | os.PathLike, title: str = "") -> Path:
    """Sorted activation-frequency curves (one per layer, freqs[l] f [n_ff] in [0, 1]) as a PNG at path."""
    img = np.full((H, W, 3), BG, dtype=np.uint8)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    positive = [f[f > 0] for f in freqs]
    lo = min((float(p.min()) for p in positive if p.size), default=1e-3)
    d_min = min(-1, int(np.floor(np.log10(lo))))  # lowest decade shown
    span = -d_min

    def y_of(v: np.ndarray) -> np.ndarray:
        lv = np.log10(np.maximum(v, 10.0 ** d_min))
        return (TOP + (-lv) / span * (ph - 1)).round().astype(int)

    for d in range(d_min, 1):  # decade gridlines and labels
        y = int(y_of(np.array([10.0 ** d]))[0])
        img[y, LEFT:LEFT + pw] = GRID
        _text(img, LEFT - 8 - 6 * len(f"1e{d}"), y - 3, "1" if d == 0 else f"1e{d}")
    for k in range(0, 11, 2):  # x ticks at 0, 0.2, ..., 1
        x = LEFT + round(k / 10 * (pw - 1))
        img[TOP:TOP + ph, x] = GRID
        label = f"{k / 10:g}"
        _text(img, x - 3 * len(label), TOP + ph + 6, label)
    img[TOP:TOP + ph, LEFT] = AXIS
    img[TOP + ph - 1, LEFT:LEFT + pw] = AXIS

    xs = np.arange(pw)
    for il, f in enumerate(freqs):
        s = np.sort(np.asarray(f, dtype=np.float64))[::-1]
        idx = np.minimum((xs / max(1, pw - 1) * (len(s) - 1)).round().astype(int), len(s) - 1)
        ys = y_of(s[idx])
        color = _layer_color(il, len(freqs))
        for x in range(pw):  # connect consecutive points with vertical runs
            a, b = ys[x], ys[x - 1] if x else ys[x]
            img[min(a, b):max(a, b) + 1, LEFT + x] = color
    for il in range(len(freqs)):  # legend: a colour swatch and the layer number
        row = TOP + 4 + il * 12 if len(freqs) <= (ph // 12) else TOP + 4 + round(il * (ph - 12) / len(freqs))
        if len(freqs) > ph // 12 and il not in (0, len(freqs) - 1) and il % max(1, len(freqs) // 8):
            continue
        img[row + 2:row + 5, W - RIGHT + 12:W - RIGHT + 28] = _layer_color(il, len(freqs))
        _text(img, W - RIGHT + 34, row, f"L{il}")
    _text(img, LEFT, H - 22, "NEURON RANK (FRACTION OF NEURONS, MOST ACTIVE FIRST)")
    _text(img, 8, 12, "ACTIVATION FREQUENCY (LOG)" + (f"  {title}" if title else ""))
    return write_png(path, img)


def read_png_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) from a PNG header: for tests and sanity checks."""
    head = Path(path).read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path}: not a PNG file")
    return struct.unpack(">II", head[16:24])
