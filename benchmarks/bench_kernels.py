"""Matmul kernel benchmark: read-bandwidth probe, then decode mat-vec GB/s and prefill GFLOP/s per weight type,
and the row-gather mat-vec (matmul_rows) at 10% and 50% of the rows selected.

    python benchmarks/bench_kernels.py [--threads N] [--repeat R] [--n-tok 64] [--probe-mib 1024]

The mat-vec (one token) of a matrix much larger than the caches is bound by memory reads, so its GB/s is
printed beside what pi_read_probe reads from a 1 GiB buffer, timed round-robin with it (the ratio is the
figure of merit, >= 80% is the target). Prefill (n_tok tokens at once) should be compute bound: GFLOP/s = 2*M*K*N / s.
Each figure is the median of --repeat runs (best GB/s: the fastest run, a hint when other work shares the cores); every weight matrix is a fresh random one of 4096 x 11008 and
11008 x 4096 (LLaMA-7B FFN shapes). The row-gather figures are GB/s on the bytes of the selected rows only
(gather 10% / 50%), beside the dense mat-vec's GB/s: equal figures mean skipped rows cost nothing.

    python benchmarks/bench_kernels.py --axpy [--types F16,BF16,Q8_0,Q8T,F32] [--axpy-threads 1,2]
        [--sparsity 0,0.4,0.5,0.6] [--shapes 4096x12288,4096x22016,11008x4096] [--prefill-tok 128]

--axpy: instead, the column-sparse mat-vec of the model-wide sparse mode, pi_axpy_rows over the rows of a stored
transpose w_t [n_in, n_out] (Q8T: pi_axpy_q8t over the Q8 tiles that quantized sources become, int8 codes and one
f32 scale per 32 x 32 tile, set against the dense Q8_0 prefill of the same matrix) (4096 x 12288: q|k|v side by side, 4096 x 22016: gate|up, 11008 x 4096: down), one
token, with the given fraction of rows dropped (random rows, ascending). GB/s is on the touched bytes (kept rows x
row bytes), set against pi_read_probe with the same thread count, timed round-robin with it (one call each per
round, every thread count and sparsity of a matrix in the same rounds): over 256 MiB, and over as many bytes as
the call touches ("same"; the ratio that counts: on a host shared with other work a 256 MiB probe spans several
scheduler time slices where a 2 ms call often spans none, which flatters a short call against the long probe). Every call starts cold: a buffer of 4x
the L3 is read before it. Then (--prefill-tok > 0, all threads) the batch path on the same layout, every row
live, against the dense prefill pi_matmul on the original layout of the same matrix, w [n_out, n_in]: their
time ratio (>= 0.9 is the target).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the source tree, unless installed

from powerinfer_py.kernels import cpu, ref  # noqa: E402
from powerinfer_py.kernels.ref_iq import put_iq1m_d  # noqa: E402
from powerinfer_py.gguf.types import GGMLType, Tensor  # noqa: E402
from roundrobin import round_robin  # noqa: E402  (benchmarks/, beside this script)

TYPES = (GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.F16,
         GGMLType.BF16, GGMLType.F32,
         GGMLType.Q4_1, GGMLType.Q5_1, GGMLType.IQ4_NL,
         GGMLType.Q2_K,
         GGMLType.Q3_K,
         GGMLType.IQ4_XS,
         GGMLType.MXFP4,
         GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ2_S,
         GGMLType.IQ1_S, GGMLType.IQ1_M,
         )
K_F16_FIELDS = {GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),  # f16 scales in a block
                GGMLType.Q2_K: (80, 82),
                GGMLType.Q3_K: (108,),
                GGMLType.IQ4_XS: (0,),
                **{t: (0,) for t in (GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_XXS, GGMLType.IQ2_XS,
                                     GGMLType.IQ2_S, GGMLType.IQ1_S)},  # f16 d first; any grid index, sign or scale byte is valid
                GGMLType.IQ1_M: (),  # its f16 d: the top nibbles of the scale words (set below)
                }
K_F16_FIELDS[GGMLType.IQ4_NL] = (0,)  # random bytes after its f16 d are a valid IQ4_NL block
K_F16_FIELDS[GGMLType.MXFP4] = ()  # no f16: byte 0 is an E8M0 exponent, set to sane scales below
SHAPES = ((11008, 4096), (4096, 11008))  # (rows M, cols K)
COLD_BYTES = 256 << 20  # rotate over weight copies adding up to this much: well past the last-level cache


def timings(fn, repeat: int) -> tuple[float, float]:
    """(median, best) seconds of fn over `repeat` runs after one warm-up (page faults, pool start)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def random_weight(ggml_type: GGMLType, n_rows: int, n_cols: int, rng) -> Tensor:
    """A random weight in the type's layout, quantized 1024 rows at a time to keep the f32 copy small
    (K-quants, IQ4_NL and MXFP4, which we do not produce: random blocks with sane f16 or E8M0 scales)."""
    if ggml_type in K_F16_FIELDS:
        block, size = GGML_QUANT_SIZES[ggml_type]
        b = rng.integers(0, 256, (n_rows * n_cols // block, size), dtype=np.uint8)
        for off in K_F16_FIELDS[ggml_type]:
            b[:, off:off + 2] = rng.uniform(0.001, 0.02, len(b)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        if ggml_type == GGMLType.MXFP4:
            b[:, 0] = rng.integers(118, 124, len(b))  # block scales 2^-9 .. 2^-4
        if ggml_type == GGMLType.IQ1_M:
            put_iq1m_d(b, rng.uniform(0.001, 0.02, len(b)))
        return Tensor(f"w_{ggml_type.name}", ggml_type, (n_rows, n_cols), b.reshape(n_rows, -1))
    parts = [cpu.quantize(rng.standard_normal((min(1024, n_rows - r), n_cols), dtype=np.float32), ggml_type)
             for r in range(0, n_rows, 1024)]
    return Tensor(f"w_{ggml_type.name}", ggml_type, (n_rows, n_cols), np.concatenate(parts))


def transposed_pair(ggml_type: GGMLType, n_in: int, n_out: int, rng, with_dense: bool) -> tuple[Tensor, Tensor | None]:
    """One random matrix W [n_out, n_in] stored as its transpose w_t [n_in, n_out] (the AXPY's layout) and, with
    with_dense, also as w [n_out, n_in] (the dense mat-vec's), both quantized from the same f32 values."""
    wf = rng.standard_normal((n_out, n_in), dtype=np.float32)
    wt = np.concatenate([cpu.quantize(np.ascontiguousarray(wf[:, r:r + 1024].T), ggml_type)
                         for r in range(0, n_in, 1024)])
    return Tensor("w_t", ggml_type, (n_in, n_out), wt), dense_weight(wf, ggml_type) if with_dense else None


def dense_weight(wf: np.ndarray, ggml_type: GGMLType) -> Tensor:
    """wf [n_out, n_in] quantized to ggml_type in its own (dense mat-vec) layout, 1024 rows at a time."""
    return Tensor("w", ggml_type, wf.shape, np.concatenate(
        [cpu.quantize(np.ascontiguousarray(wf[r:r + 1024]), ggml_type) for r in range(0, wf.shape[0], 1024)]))


class AxpyWeight:
    """The stored transpose one --axpy row times, and how to call its kernel in C: a GGML type through
    pi_axpy_rows, or "Q8T" (the Q8 tiles that calibrate --wide writes for quantized sources) through pi_axpy_q8t,
    whose dense counterpart is the Q8_0 matrix it would be calibrated from."""

    def __init__(self, name: str, n_in: int, n_out: int, rng, with_dense: bool):
        self.name, self.n_in, self.n_out = name, n_in, n_out
        lib, ffi = cpu.lib, cpu.ffi
        if name == "Q8T":
            wf = rng.standard_normal((n_out, n_in), dtype=np.float32)
            tiles = ref.quantize_q8_tiles(wf.T)
            self._keep = (tiles.q, tiles.d)
            qp, dp = ffi.from_buffer("int8_t[]", tiles.q), ffi.from_buffer("float[]", tiles.d)
            self.nbytes = tiles.q.nbytes + tiles.d.nbytes
            self.call = lambda k, rp, hp, n_sel, n_tok, yp: lib.pi_timed_axpy_q8t(
                k._pool, qp, dp, n_in, n_out, rp, hp, n_sel, n_tok, yp)
            dense = dense_weight(wf, GGMLType.Q8_0) if with_dense else None
        else:
            ty = GGMLType[name]
            w_t, dense = transposed_pair(ty, n_in, n_out, rng, with_dense)
            self._keep = w_t.data
            wp = ffi.from_buffer(w_t.data)
            self.nbytes = w_t.data.nbytes
            self.call = lambda k, rp, hp, n_sel, n_tok, yp: lib.pi_timed_axpy_rows(
                k._pool, int(ty), wp, n_out, rp, hp, n_sel, n_tok, yp)
        self.row_bytes = self.nbytes // n_in  # (Q8T: the codes and the row's share of the tile scales)
        self.dense = dense


def axpy_table(args) -> None:
    """The --axpy table (see the module docstring)."""
    lib, ffi = cpu.lib, cpu.ffi
    rng = np.random.default_rng(0)
    threads = [int(v) for v in args.axpy_threads.split(",")]
    pools = {n: cpu.CpuKernels(n) for n in threads}
    probe = np.ones(256 << 20, dtype=np.uint8)
    probe_p = ffi.from_buffer(probe)
    flush = np.ones(4 * args.l3_mib << 20, dtype=np.uint8)
    big = pools[max(threads)]
    sparsities = [float(v) for v in args.sparsity.split(",")]
    shapes = [tuple(int(d) for d in v.split("x")) for v in args.shapes.split(",")]
    types = [t.strip().upper() for t in (args.types or "F16,BF16,Q8_0,Q8T,F32").split(",")]
    for t in types:
        if t != "Q8T" and t not in GGMLType.__members__:
            raise SystemExit(f"--types: unknown weight type {t!r} (a GGML type name, or Q8T for the Q8 tiles)")
    print(f"pi_axpy_rows (Q8T: pi_axpy_q8t), one token, cold weights; median of {args.repeat} interleaved rounds; "
          f"GB/s on the touched bytes; probe = pi_read_probe with the same thread count in the same rounds")
    print("probe: 256 MiB; same: the probe over the bytes the call touches (the ratio that counts, see below)")
    print(f"{'type':<5} {'n_in x n_out':>12} {'thr':>3} {'dropped':>7} {'us':>9} {'GB/s':>6} {'probe':>6} {'ratio':>6} "
          f"{'same':>6} {'ratio':>6}")
    summary = []
    for ty in types:
        for n_in, n_out in shapes:
            aw = AxpyWeight(ty, n_in, n_out, rng, False)
            rb = aw.row_bytes
            fns, touched = {}, {}
            for n, k in pools.items():
                fns[("probe", n)] = lambda k=k: lib.pi_timed_read_probe(k._pool, probe_p, probe.nbytes)
            # the probe over as many bytes as each call touches, cold as well: a call of the same length is
            # exposed to the same preemptions on a shared host (a 256 MiB probe takes several time slices,
            # a 2 ms kernel call often none), so this is the ratio's denominator
            need = max(n_in * rb, probe.nbytes)
            same = probe if need <= probe.nbytes else np.ones(need, dtype=np.uint8)
            same_p = ffi.from_buffer(same)
            for s in sparsities:
                keep = n_in - int(round(s * n_in))
                rows = np.sort(rng.choice(n_in, keep, replace=False)).astype(np.int32)
                h = (rng.standard_normal(keep, dtype=np.float32) + np.float32(0.01))
                h[h == 0] = 1.0
                touched[s] = keep * rb
                for n, k in pools.items():
                    fns[("same", s, n)] = (lambda k=k, nb=keep * rb: lib.pi_timed_read_probe(k._pool, same_p, nb))
                y = np.empty(n_out, np.float32)
                for n, k in pools.items():
                    fns[(s, n)] = (lambda k=k, rows=rows, h=h, y=y: aw.call(
                        k, ffi.from_buffer("int32_t[]", rows), ffi.from_buffer("float[]", h), len(rows), 1,
                        ffi.from_buffer("float[]", y)))
            med = {key: statistics.median(t) for key, t in
                   round_robin(fns, args.repeat, lambda: big.read_probe(flush), self_timed=True).items()}
            for n in threads:
                probe_gbs = probe.nbytes / med[("probe", n)] / 1e9
                for s in sparsities:
                    gbs = touched[s] / med[(s, n)] / 1e9
                    same_gbs = touched[s] / med[("same", s, n)] / 1e9
                    summary.append((ty, n_in, n_out, n, s, gbs, same_gbs))
                    print(f"{ty:<5} {f'{n_in}x{n_out}':>12} {n:>3} {s:>7.0%} {med[(s, n)] * 1e6:>9.1f} "
                          f"{gbs:>6.1f} {probe_gbs:>6.1f} {gbs / probe_gbs:>6.0%} {same_gbs:>6.1f} "
                          f"{gbs / same_gbs:>6.0%}", flush=True)
            del aw, same, same_p
    if args.prefill_tok > 0:
        k = big
        n_tok = args.prefill_tok
        print(f"prefill, {n_tok} tokens, {k.n_threads} threads, warm; median of {max(3, args.repeat // 3)} "
              f"interleaved rounds: pi_axpy_rows on w_t (every row live) vs pi_matmul on w")
        print(f"{'type':<5} {'n_in x n_out':>12} {'axpy ms':>8} {'GFLOP/s':>8} {'dense ms':>9} {'GFLOP/s':>8} "
              f"{'dense/axpy':>10}")
        for ty in types:
            for n_in, n_out in shapes:
                aw = AxpyWeight(ty, n_in, n_out, rng, True)
                w = aw.dense
                x = rng.standard_normal((n_tok, n_in), dtype=np.float32)
                rows = np.arange(n_in, dtype=np.int32)
                y1, y2 = np.empty((n_tok, n_out), np.float32), np.empty((n_tok, n_out), np.float32)
                wdp = ffi.from_buffer(w.data)
                xp, rp = ffi.from_buffer("float[]", x), ffi.from_buffer("int32_t[]", rows)
                fns = {"axpy": lambda: aw.call(k, rp, xp, n_in, n_tok, ffi.from_buffer("float[]", y1)),
                       "dense": lambda: lib.pi_timed_matmul(k._pool, int(w.type), wdp, n_out, n_in, xp, n_tok,
                                                            ffi.from_buffer("float[]", y2))}
                med = {key: statistics.median(t) for key, t in
                       round_robin(fns, max(3, args.repeat // 3), None, self_timed=True).items()}
                fl = 2.0 * n_in * n_out * n_tok / 1e9
                print(f"{ty:<5} {f'{n_in}x{n_out}':>12} {med['axpy'] * 1e3:>8.1f} {fl / med['axpy']:>8.1f} "
                      f"{med['dense'] * 1e3:>9.1f} {fl / med['dense']:>8.1f} {med['dense'] / med['axpy']:>10.2f}",
                      flush=True)
                del aw, w, wdp
    worst = {}
    for name, _, _, n, s, gbs, probe_gbs in summary:
        if s > 0:
            key = (name, n)
            worst[key] = min(worst.get(key, 9.0), gbs / probe_gbs)
    print("lowest ratio to the same-size probe at the sparsities > 0: " + ", ".join(f"{name} {n}t {r:.0%}" for (name, n), r in worst.items()))
    for k in pools.values():
        k.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="threads (default: all cores)")
    ap.add_argument("--repeat", type=int, default=15, help="timed runs per figure (median)")
    ap.add_argument("--n-tok", type=int, default=64, help="tokens in the prefill matmul")
    ap.add_argument("--probe-mib", type=int, default=1024, help="size of the bandwidth probe buffer")
    ap.add_argument("--types", default=None, help="comma-separated weight types (default: all; with --axpy "
                    "F16,BF16,Q8_0,Q8T,F32; Q8T = the Q8 tiles)")
    ap.add_argument("--axpy", action="store_true", help="instead: the column-sparse AXPY table (module docstring)")
    ap.add_argument("--axpy-threads", default="1,2", help="--axpy: thread counts, comma-separated")
    ap.add_argument("--sparsity", default="0,0.4,0.5,0.6", help="--axpy: fractions of rows dropped")
    ap.add_argument("--shapes", default="4096x12288,4096x22016,11008x4096", help="--axpy: n_in x n_out of w_t")
    ap.add_argument("--prefill-tok", type=int, default=128, help="--axpy: tokens of the prefill comparison (0: none)")
    ap.add_argument("--l3-mib", type=int, default=32, help="--axpy: last-level cache size (evicted between calls)")
    args = ap.parse_args()
    if args.axpy:
        return axpy_table(args)
    if args.types is None:
        args.types = ",".join(t.name for t in TYPES)

    k = cpu.CpuKernels(args.threads)
    rng = np.random.default_rng(0)
    buf = np.ones(args.probe_mib << 20, dtype=np.uint8)  # touched, so the probe reads real pages

    # a shared host's read bandwidth drifts from minute to minute: each mat-vec is timed round-robin with the
    # probe (one call each per round) and compared with the probe's median from the same rounds
    t_probe, _ = timings(lambda: k.read_probe(buf), 5)
    print(f"threads {k.n_threads}; read probe over {args.probe_mib} MiB: {buf.nbytes / t_probe / 1e9:.1f} GB/s")
    print(f"{'type':<6} {'M x K':>12} {'matvec ms':>10} {'GB/s':>7} {'% probe':>8} {'best GB/s':>10} "
          f"{'prefill ms':>11} {'GFLOP/s':>8} {'x matvec':>9} {'gather10 GB/s':>14} {'gather50 GB/s':>14}")
    for ggml_type in (GGMLType[name] for name in args.types.split(",")):
        for n_rows, n_cols in SHAPES:
            w = random_weight(ggml_type, n_rows, n_cols, rng)
            x1 = rng.standard_normal(n_cols, dtype=np.float32)
            xn = rng.standard_normal((args.n_tok, n_cols), dtype=np.float32)
            # Decode reads each weight once per token from memory, never from cache: rotate over copies that
            # together exceed the last-level cache, so the mat-vec GB/s is a memory figure like the probe's.
            copies = [w] + [Tensor(w.name, w.type, w.shape, w.data.copy())
                            for _ in range(-(-COLD_BYTES // w.nbytes) - 1)]
            # the C call itself (the Python wrapper runs cold after the probe and would add tens of us)
            lib, ffi = cpu.lib, cpu.ffi
            y1 = np.empty(n_rows, np.float32)
            x1p, y1p = ffi.from_buffer("float[]", x1), ffi.from_buffer("float[]", y1)
            turn = itertools.cycle([ffi.from_buffer(c.data) for c in copies])
            rr = round_robin({"probe": lambda: k.read_probe(buf),
                              "matvec": lambda: lib.pi_matmul(k._pool, int(ggml_type), next(turn), n_rows, n_cols, x1p,
                                                              1, y1p)},
                             args.repeat)
            probe_gbs = buf.nbytes / statistics.median(rr["probe"]) / 1e9
            t1, t1_best = statistics.median(rr["matvec"]), min(rr["matvec"])
            tn, _ = timings(lambda: k.matmul(w, xn), max(3, args.repeat // 3))
            gbs = w.nbytes / t1 / 1e9
            gflops = 2.0 * n_rows * n_cols * args.n_tok / tn / 1e9
            gather = []
            for frac in (0.1, 0.5):  # random ascending rows, as a sparse FFN selects them
                rows = np.sort(rng.choice(n_rows, int(frac * n_rows), replace=False)).astype(np.int32)
                tg, _ = timings(lambda: k.matmul_rows(w, rows, x1), args.repeat)
                gather.append(len(rows) * (w.nbytes // n_rows) / tg / 1e9)
            print(f"{ggml_type.name:<6} {f'{n_rows}x{n_cols}':>12} {t1 * 1e3:>10.3f} {gbs:>7.1f} "
                  f"{100 * gbs / probe_gbs:>7.0f}% {w.nbytes / t1_best / 1e9:>10.1f} {tn * 1e3:>11.2f} {gflops:>8.1f} "
                  f"{tn / t1:>9.1f} {gather[0]:>14.1f} {gather[1]:>14.1f}")
            del w, copies, turn
    k.close()


if __name__ == "__main__":
    main()
