"""Write a copy of a GGUF model whose 2-D layer matrices are random valid I-quant blocks, for speed runs.

    python benchmarks/random_iq_gguf.py SRC.gguf DST.gguf --type IQ1_S [--seed 0] [--output-type Q4_0]

llama.cpp's quantizer refuses IQ1_S, IQ1_M, IQ2_* and IQ3_XXS without an importance matrix, so a file of those
types to time both engines on is made here: every `blk.*` 2-D weight becomes random blocks (any grid index, sign,
delta and scale is valid) with one f16 d per tensor chosen so that the weights keep the source tensor's spread;
embeddings, output and norms stay as they are (--output-type Q8_0 / Q4_0: the output matrix quantized to that, so
that an F16 output does not outweigh the layers in a decode step). The numbers are noise, the shapes and the bytes are a real model's:
what a speed comparison needs (tests/test_iq_llama_cpp.py checks the two engines agree on such files).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import quants as gguf_quants

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the source tree, unless installed

from powerinfer_py.gguf import open_gguf  # noqa: E402
from powerinfer_py.gguf.writer import write_gguf  # noqa: E402
from powerinfer_py.kernels.ref_iq import IQ_TYPES, put_iq1m_d  # noqa: E402
from powerinfer_py.gguf.types import GGML_QUANT_SIZES, GGMLType, Tensor  # noqa: E402


def set_d(blocks: np.ndarray, ggml_type: GGMLType, d: float) -> None:
    """Every block's f16 d := d (bytes 0..1; IQ1_M: the top nibbles of its scale words)."""
    if ggml_type == GGMLType.IQ1_M:
        put_iq1m_d(blocks, np.full(len(blocks), d))
    else:
        blocks[:, :2] = np.array([d], np.float16).view(np.uint8)


def random_blocks(t: Tensor, ggml_type: GGMLType, rng) -> Tensor:
    n_rows, n_cols = t.shape
    _, size = GGML_QUANT_SIZES[ggml_type]
    b = rng.integers(0, 256, (n_rows * n_cols // 256, size), dtype=np.uint8)
    set_d(b, ggml_type, 1.0)
    unit_std = gguf_quants.dequantize(b[:4096], ggml_type).std()  # a sample: all blocks share d
    src_std = float(np.asarray(t.data[:1024], np.float32).std())
    set_d(b, ggml_type, src_std / unit_std)
    return Tensor(t.name, ggml_type, t.shape, b.reshape(n_rows, -1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--type", default="IQ1_S", choices=[t.name for t in IQ_TYPES])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-type", choices=["Q8_0", "Q4_0"], default=None)
    args = ap.parse_args()
    ggml_type = GGMLType[args.type]
    rng = np.random.default_rng(args.seed)
    f = open_gguf(args.src)
    tensors = [random_blocks(t, ggml_type, rng) if name.startswith("blk.") and len(t.shape) == 2 else t
               for name, t in f.tensors.items()]
    if args.output_type:
        from powerinfer_py.kernels import cpu
        out_type = GGMLType[args.output_type]
        for i, t in enumerate(tensors):
            if t.name == "output.weight":
                parts = [cpu.quantize(np.asarray(t.data[r:r + 1024], np.float32), out_type)
                         for r in range(0, t.shape[0], 1024)]
                tensors[i] = Tensor(t.name, out_type, t.shape, np.concatenate(parts))
    write_gguf(args.dst, f.metadata, tensors, types=f.metadata_types)
    f.close()
    print(f"wrote {args.dst} ({args.dst.stat().st_size / 2**30:.2f} GiB), layer matrices {ggml_type.name}")


if __name__ == "__main__":
    main()
