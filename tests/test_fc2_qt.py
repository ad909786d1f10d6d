"""The copy by hidden unit of a Q4_0 / Q8_0 predictor fc2 (csrc/fc2t.c): packing gives the numpy reference's
bytes and keeps every code and scale of the file; fc2t_logits equals the mat-vec's value within its rounding
bound, equals the numpy reference of its own arithmetic bit for bit on one thread, is deterministic for a
thread count, and refuses what it cannot use."""
from __future__ import annotations

import numpy as np
import pytest

from powerinfer_py.kernels import ref
from powerinfer_py.gguf.types import GGMLType, Tensor

cpu = pytest.importorskip("powerinfer_py.kernels.cpu", reason="C extension not built", exc_type=ImportError)

TYPES = (GGMLType.Q4_0, GGMLType.Q8_0)
# n_ff: below, at and past one 64-output tile, not a multiple of 64, the 7B shape / 8; rank: 1 to 32 blocks
SHAPES = [(1, 32), (63, 32), (64, 64), (65, 96), (230, 64), (1376, 1024)]
by_type = pytest.mark.parametrize("ggml_type", TYPES, ids=lambda t: t.name)


def fc2_tensor(ggml_type, n_ff, rank, seed=0) -> Tensor:
    w = np.random.default_rng(seed).standard_normal((n_ff, rank)).astype(np.float32)
    return Tensor("blk.0.fc2.weight", ggml_type, (n_ff, rank), ref.quantize(w, ggml_type))


def hidden(rank, density, rng, signed=False) -> np.ndarray:
    """A predictor hidden vector: relu values (or signed ones) with about `density` of them non-zero."""
    v = rng.standard_normal(rank)
    if not signed:
        v = np.abs(v)
    return (v * (rng.random(rank) < density)).astype(np.float32)


@by_type
@pytest.mark.parametrize("n_ff,rank", SHAPES)
def test_pack_matches_reference_and_keeps_codes(pools, ggml_type, n_ff, rank):
    t = fc2_tensor(ggml_type, n_ff, rank)
    want = ref.fc2t_pack(t)
    assert want.data.size == cpu.lib.pi_fc2t_bytes(int(ggml_type), n_ff, rank) == ref.fc2t_bytes(ggml_type, n_ff, rank)
    dw, qw = ref._blocks(t)
    for k in pools.values():
        got = k.fc2t_pack(t)
        assert (got.type, got.n_ff, got.rank, got.name) == (ggml_type, n_ff, rank, "blk.0.fc2_t.weight")
        assert got.data.ctypes.data % 64 == 0
        assert np.array_equal(got.data, want.data)
        codes, d = ref.fc2t_unpack(got)
        assert np.array_equal(d, dw)  # every f16 scale of the file
        assert np.array_equal(codes, qw.reshape(n_ff, rank))  # every code


@by_type
@pytest.mark.parametrize("n_ff,rank", SHAPES)
def test_logits_equal_the_matvec_value(pools, ggml_type, n_ff, rank):
    """Against the mat-vec's exact value (ref.matmul, f64) within the bound the mat-vec tests use; on one
    thread the bits of ref.fc2t_logits (the same integers and fma chain); repeated runs give the same bits."""
    t = fc2_tensor(ggml_type, n_ff, rank, seed=1)
    q_ref = ref.fc2t_pack(t)
    rng = np.random.default_rng(2)
    cases = [hidden(rank, d, rng) for d in (0.0, 0.02, 0.5, 1.0)] + [hidden(rank, 0.6, rng, signed=True)]
    cases.append(np.zeros(rank, np.float32))
    cases[-1][rank // 2] = 1e-30  # code 127, but the block's f16 scale underflows to 0: logits 0
    for k_threads, k in pools.items():
        q = k.fc2t_pack(t)
        for r in cases:
            got = k.fc2t_logits(q, r)
            exact = ref.matmul(t, r[None])[0]
            bound = ref.matmul_abs_terms(t, r[None])[0]
            assert np.all(np.abs(got.astype(np.float64) - exact) <= 2e-6 * bound + 1e-45), (k_threads, n_ff, rank)
            if k_threads == 1:
                assert np.array_equal(got.view(np.uint32), ref.fc2t_logits(q_ref, r).view(np.uint32))
            assert np.array_equal(got.view(np.uint32), k.fc2t_logits(q, r).view(np.uint32))
            if not r.any():
                assert not got.any()


@by_type
def test_logits_skip_the_zero_units(pools, ggml_type):
    """Rows of units whose code is 0 are never read: garbage in them changes nothing, garbage in a live row
    changes the logits (so the test can fail)."""
    n_ff, rank = 230, 96
    t = fc2_tensor(ggml_type, n_ff, rank, seed=4)
    k = pools[2]
    q = k.fc2t_pack(t)
    r = hidden(rank, 0.5, np.random.default_rng(5))
    r[7], r[40] = 0.0, 1.5
    want = k.fc2t_logits(q, r)
    rowb = q.data.size // rank - ref.fc2t_padded(n_ff) * 2 // 32  # code bytes per row
    assert rowb == (ref.fc2t_padded(n_ff) // (2 if ggml_type == GGMLType.Q4_0 else 1))
    spoilt = ref.FC2T(q.name, q.type, n_ff, rank, q.data.copy())
    spoilt.data[7 * rowb:8 * rowb] ^= 0x5A
    assert np.array_equal(k.fc2t_logits(spoilt, r), want)
    spoilt.data[40 * rowb:41 * rowb] ^= 0x5A
    assert not np.array_equal(k.fc2t_logits(spoilt, r), want)


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("ggml_type,code", [(GGMLType.Q4_0, 0), (GGMLType.Q4_0, 15), (GGMLType.Q8_0, 127),
                                            (GGMLType.Q8_0, -127), (GGMLType.Q8_0, -128)])
def test_extreme_codes_do_not_overflow(pools, ggml_type, code, sign):
    """Every code at an end of its range and every r code 127 (or -127: a general r, not only relu outputs):
    the block sums reach 32 * 15 * 127 (Q4_0, before the offset; its 16-bit partial sums hold eight pairs of
    units, not more) or 32 * 128 * 127 (Q8_0, whose pairs reach 2 * 128 * 127 in 16 bits); one sign throughout,
    so that errors of opposite signs cannot cancel."""
    n_ff, rank = 130, 1024
    size = 18 if ggml_type == GGMLType.Q4_0 else 34
    blocks = np.zeros((n_ff, rank // 32, size), np.uint8)
    blocks[..., :2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
    blocks[..., 2:] = code * 0x11 if ggml_type == GGMLType.Q4_0 else np.uint8(code % 256)
    t = Tensor("fc2", ggml_type, (n_ff, rank), blocks.reshape(n_ff, -1))
    r = np.full(rank, 2.0 * sign, np.float32)
    exact = ref.matmul(t, r[None])[0]  # |exact| ~ 3e4 (Q4_0) to 1.3e5 (Q8_0); a wrapped 16-bit sum is off by >= 200
    for k in pools.values():
        got = k.fc2t_logits(k.fc2t_pack(t), r)
        np.testing.assert_allclose(got, exact, rtol=1e-6, atol=0)


def test_bad_input(pools):
    k = pools[2]
    with pytest.raises(ValueError, match="must be a 2-D Q4_0 or Q8_0 tensor, got Q5_0"):
        w = np.ones((64, 32), np.float32)
        k.fc2t_pack(Tensor("blk.0.fc2.weight", GGMLType.Q5_0, (64, 32), ref.quantize(w, GGMLType.Q5_0)))
    t = fc2_tensor(GGMLType.Q4_0, 100, 64)
    q = k.fc2t_pack(t)
    with pytest.raises(ValueError, match=r"r must be a float32 array of shape \(64,\)"):
        k.fc2t_logits(q, np.ones(63, np.float32))
    with pytest.raises(ValueError, match="r must be a float32 array"):
        k.fc2t_logits(q, np.ones(64, np.float64))
    with pytest.raises(ValueError, match="does not hold a copy of a 100 x 64 Q4_0 fc2"):
        k.fc2t_logits(ref.FC2T(q.name, q.type, 100, 64, q.data[:-1]), np.ones(64, np.float32))
    with pytest.raises(ValueError, match="does not hold a copy of a 100 x 64 Q8_0 fc2"):  # the size of another type
        k.fc2t_logits(ref.FC2T(q.name, GGMLType.Q8_0, 100, 64, q.data), np.ones(64, np.float32))
    with pytest.raises(ValueError, match="expected an FC2T"):
        k.fc2t_logits(t, np.ones(64, np.float32))
    with pytest.raises(ValueError, match="fc2_t is a copy of a 100 x 64 fc2, expected"):
        rng = np.random.default_rng(0)
        mk = lambda nm, r, c: Tensor(nm, GGMLType.Q4_0, (r, c),  # noqa: E731
                                     ref.quantize(rng.standard_normal((r, c)).astype(np.float32), GGMLType.Q4_0))
        k.steps.sparse_ffn_plan("reglu", mk("fc1", 64, 64), mk("fc2", 96, 64), mk("gate", 96, 64), mk("up", 96, 64),
                                mk("down_t", 96, 64), 0.0, fc2_t=q)
    closed = cpu.CpuKernels(1)
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed.fc2t_logits(q, np.ones(64, np.float32))
