"""The model-wide sparse mode (layers/wide.py, tools/wide_calibrate.py) on tiny synthetic models: the wide
forward against a numpy forward pass whose projection inputs are zeroed the same way, `--sparse off` on a
calibrated file against its source, batches against one token at a time, the stored layout and metadata."""
from __future__ import annotations

import numpy as np
import pytest

import powerinfer_py
from powerinfer_py.gguf import open_gguf, write_gguf
from powerinfer_py.gguf.types import GGMLType, Tensor
from powerinfer_py.kernels import ref as R
from powerinfer_py.kernels.ref import dequantize
from powerinfer_py.layers import wide as W
from powerinfer_py.tools.wide_calibrate import calibrate_wide, greedy_alloc, loss_curves, uniform_alloc

TEXT = " ".join(["once upon a time the cat sat on the mat and the dog ran far away to the sea"] * 12)
PROMPT = [1, 40, 77, 300, 12, 9, 250, 31]


@pytest.fixture(scope="module")
def wide_file(synthetic_model, tmp_path_factory):
    """(source, calibrated) per (arch, dtype, criterion), written once per module."""
    made = {}

    def make(arch="llama", dtype="f32", criterion="wina", sparsity=0.4, rotate=False, **kw):
        key = (arch, dtype, criterion, sparsity, rotate, tuple(sorted(kw.items())))
        if key not in made:
            src = synthetic_model(arch, dtype, **kw)
            out = tmp_path_factory.mktemp("wide") / f"{arch}-{dtype}-{criterion}.gguf"
            calibrate_wide(src, out, sparsity, text=TEXT, n_tokens=160, ctx=64, threads=1, criterion=criterion,
                           rotate=rotate)
            made[key] = (src, out)
        return made[key]

    return make


def _logits(path, tokens, threads=1, backend="cpu", **kw):
    with powerinfer_py.load(path, threads=threads, backend=backend, n_ctx=64, **kw) as llm:
        cache = llm.model.new_cache(64)
        first = llm.model.forward(np.asarray(tokens[:-1], np.int32), cache, all_logits=True)
        last = llm.model.forward(np.asarray(tokens[-1:], np.int32), cache)  # one decode step
        return np.vstack([first, last[None]]), llm.sparsity_stats, llm.sparse


class _RefWide:
    """The numpy reference of one wide layer: dense W (n_out, n_in) of the source file times x with the inputs
    whose score is below the cut-off set to zero. A weight in Q8 tiles (a quantized source) is the numpy spec's
    axpy_tiles over every row with the zeroed x: the zeros add nothing and leave each tile's activation scale
    as it is, so it must equal the wide path's AXPY over the kept rows alone."""

    def __init__(self, mats, cuts, scales, q_split, n_ff, act, kernels, rot=None, bf16=None):
        self.mats, self.cuts, self.scales, self.q_split, self.n_ff, self.act = mats, cuts, scales, q_split, n_ff, act
        self.bf16 = bf16 or [False] * 4  # BF16 stored weights: the kept inputs are multiplied rounded to bf16
        self.rot = rot or [None] * 4  # rotation tensors (rows of R^T), applied by the numpy spec's matmul
        self.k = kernels  # the numpy spec's activations (kernels/ref.py), as the model's own ops
        self.kept = np.zeros(4, np.int64)

    def _proj(self, j, x):
        x = np.ascontiguousarray(x, np.float32)
        if self.rot[j] is not None:
            x = self.k.matmul(self.rot[j], x)
        if self.cuts[j] > 0:
            score = np.abs(x) * (1.0 if self.scales is None else self.scales[j])
            keep = score >= np.float32(self.cuts[j])
        else:
            keep = np.ones(x.shape, bool)
        self.kept[j] += int(keep.sum())
        if isinstance(self.mats[j], R.Q8Tiles):
            w = self.mats[j]
            return R.axpy_tiles(w, np.arange(w.n_rows, dtype=np.int32), np.where(keep, x, np.float32(0)))
        xk = np.where(keep, x, np.float32(0))
        if self.bf16[j]:
            xk = R.bf16_round(xk)
        return (xk.astype(np.float64) @ self.mats[j].T.astype(np.float64)).astype(np.float32)

    def qkv(self, h):
        y = self._proj(0, h)
        nq, nk, _ = self.q_split
        return y[:, :nq].copy(), y[:, nq:nq + nk].copy(), y[:, nq + nk:].copy()

    def o(self, a):
        return self._proj(1, a)

    def ffn(self, m):
        y = self._proj(2, m)
        g, u = y[:, :self.n_ff].copy(), y[:, self.n_ff:].copy()
        h = self.k.swiglu(g, u) if self.act == "swiglu" else self.k.geglu(g, u)
        return self._proj(3, h)


def _stored(tensors, name):
    """A stored transposed weight as _RefWide takes it: f32 (n_out, n_in), or Q8 tiles (copied out of the map)."""
    t = tensors[name]
    if t.type == GGMLType.I8:
        w = W.tiles_from_file(tensors, name)
        return R.Q8Tiles(name, w.q.copy(), w.d.copy())
    return np.asarray(dequantize(t), np.float32).reshape(t.shape).T.copy()


def _reference_logits(src, calibrated, tokens):
    """Logits of the numpy backend running the source file with _RefWide projections (cut-offs and scales of
    the calibrated file), and the kept counts per layer and input."""
    with powerinfer_py.load(calibrated, threads=1) as wl:
        cuts = np.asarray(wl.sparse.wide_cuts, np.float32).reshape(-1, 4)
        cal = W.parse_calibration(dict(wl.config.wide_meta), wl.config.n_layer, W.layer_widths(wl.config))
    with powerinfer_py.load(src, backend="ref", n_ctx=64, sparse="off") as llm:
        m, c = llm.model, llm.config
        nq, nkv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        refs = []
        with open_gguf(calibrated) as cf:  # the stored transposed weights (the source's values for float types)
            stored = [[_stored(cf.tensors, f"blk.{il}.{n}.weight") for n in W.WIDE_TENSORS] for il in range(c.n_layer)]
            rots = [[cf.tensors.get(f"blk.{il}.{n}_rot.weight") for n in W.INPUTS] for il in range(c.n_layer)]
            bf16 = [[cf.tensors[f"blk.{il}.{n}.weight"].type == GGMLType.BF16 for n in W.WIDE_TENSORS]
                    for il in range(c.n_layer)]
        for il, L in enumerate(m.layers):
            r = _RefWide(stored[il], cuts[il], None if cal.col_norms is None else cal.col_norms[il], (nq, nkv, nkv),
                         c.n_ff, m.ffns[il].variant, m.kernels, rots[il], bf16[il])
            L.wide = r
            refs.append(r)
        m.wide = refs
        m.ffns = [W.WideFFN(r) for r in refs]
        cache = m.new_cache(64)
        first = m.forward(np.asarray(tokens[:-1], np.int32), cache, all_logits=True)
        last = m.forward(np.asarray(tokens[-1:], np.int32), cache)
        return np.vstack([first, last[None]]), np.stack([r.kept for r in refs])


@pytest.mark.parametrize("arch,criterion,dtype,rotate", [
    ("llama", "wina", "f32", False), ("gemma3", "plain", "f32", False), ("qwen2", "greedy", "f32", False),
    ("qwen3", "wina", "f32", False), ("gemma2", "wina", "f32", False), ("llama", "plain", "q8_0", False),
    ("qwen3", "wina", "q4_0", True), ("llama", "plain", "q8_0", True), ("llama", "wina", "bf16", False)])
def test_wide_forward_equals_numpy_with_the_same_inputs_zeroed(wide_file, arch, criterion, dtype, rotate):
    """The reference multiplies the stored transposed weights (dequantized; the source's own values for float
    types, test_off_on_a_float_file_is_the_source_model) by x with the same inputs zeroed."""
    src, cal = wide_file(arch, dtype, criterion, rotate=rotate)
    ref, ref_kept = _reference_logits(src, cal, PROMPT)
    # the wide code path on the numpy backend: the reference to float64-accumulation rounding
    got, st, sparse = _logits(cal, PROMPT, backend="ref")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    np.testing.assert_array_equal(st.kept, ref_kept)
    # the C kernels: other summation orders, the same kept inputs. A rotated file rotates ffn_in by a Q8_0
    # mat-vec, which quantizes its input to 8 bits: a last-bit difference upstream can move a value one step and
    # an element near its cut-off to the other side, so there the bound is looser
    exact = not rotate
    for threads in (1, 2):
        got, st, sparse = _logits(cal, PROMPT, threads=threads)
        assert sparse.mode == "wide"
        if exact:
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=5e-4 * float(np.abs(ref).max()))
            np.testing.assert_array_equal(st.kept, ref_kept)
        else:
            rel = float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref ** 2)))
            assert rel < 0.02, rel
            assert np.all(np.abs(st.kept - ref_kept) <= 0.01 * ref_kept + 2)
    rows_read = (st.kept * st.row_bytes).sum() / (st.tokens[:, None] * st.widths * st.row_bytes).sum()
    assert 0.15 < 1 - rows_read < 0.8  # about the calibrated 40% (+ the rotations' share where rotated), other text
    assert (st.fixed_bytes > 0).all() == rotate  # the rotations' bytes count as read


def test_off_on_a_float_file_is_the_source_model(wide_file):
    """F32 and F16 sources: the transposed tensors hold the source's values exactly, and `--sparse off` gives
    the source's logits (to float rounding: the AXPY sums in another order than the mat-vec)."""
    for dtype in ("f32", "f16"):
        src, cal = wide_file("llama", dtype)
        with open_gguf(src) as s, open_gguf(cal) as c:
            for il in range(2):
                p = f"blk.{il}."
                qkv = np.vstack([np.asarray(s.tensors[p + n + ".weight"].data) for n in ("attn_q", "attn_k", "attn_v")])
                t = c.tensors[p + "attn_qkv_t.weight"]
                assert t.type == (GGMLType.F32 if dtype == "f32" else GGMLType.F16)
                np.testing.assert_array_equal(np.asarray(t.data), qkv.T)
                np.testing.assert_array_equal(np.asarray(c.tensors[p + "ffn_down_t.weight"].data),
                                              np.asarray(s.tensors[p + "ffn_down.weight"].data).T)
                assert p + "attn_q.weight" not in c.tensors and p + "ffn_gate.weight" not in c.tensors
        want, _, _ = _logits(src, PROMPT)
        got, st, sparse = _logits(cal, PROMPT, sparse="off")
        assert sparse.mode == "off"
        tol = 1e-5 if dtype == "f32" else 3e-3  # f16: the source mat-vec rounds x to f16, the AXPY does not
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))
        zero, _, _ = _logits(cal, PROMPT, sparsity=0.0)  # sparsity 0 is the same computation as off
        np.testing.assert_array_equal(zero, got)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_off_on_a_quantized_file_is_the_source_within_the_reencoding(wide_file, dtype):
    """Quantized sources are re-encoded as Q8 tiles (transpose of the dequantized matrix, int8 codes with one
    scale per 32 x 32 tile; the AXPY quantizes its input to int8 per 32 inputs): `off` stays within that
    re-encoding's error of the source, rotated or not. Measured on these random weights: 0.019-0.022 of the
    logits' size (the Q8_0 layout of older files: 0.016-0.017, test_an_old_q8_0_wide_file_loads_and_runs)."""
    for rotate in (False, True):
        _check_quantized_off(wide_file, dtype, rotate)


def _check_quantized_off(wide_file, dtype, rotate):
    src, cal = wide_file("llama", dtype, rotate=rotate)
    with open_gguf(cal) as c:
        t, sc = c.tensors["blk.0.ffn_gate_up_t.weight"], c.tensors["blk.0.ffn_gate_up_t.scale"]
        assert t.type == GGMLType.I8 and t.shape == (64, 256)
        assert sc.type == GGMLType.F32 and sc.shape == (2, 8)
        for il in range(2):
            for n in W.WIDE_TENSORS:
                assert c.tensors[f"blk.{il}.{n}.weight"].type == GGMLType.I8 and f"blk.{il}.{n}.scale" in c.tensors
        assert dict(c.metadata)[W.KEY_SOURCE_TYPES] == dtype.upper()
        if rotate:  # the rotation is applied by a mat-vec: Q8_0, as before the tiles
            assert c.tensors["blk.0.ffn_in_rot.weight"].type == GGMLType.Q8_0
    want, _, _ = _logits(src, PROMPT)
    got, _, _ = _logits(cal, PROMPT, sparse="off")
    rel = float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))
    assert 0 < rel < 0.03, rel


def test_the_tiles_hold_the_dequantized_source_transposed(wide_file):
    """Unrotated, each I8 + scale pair is exactly quantize_q8_tiles of the dequantized source matrices stacked
    and transposed (q|k|v, o, gate|up, down), the codes within [-127, 127] and every scale finite and >= 0."""
    src, cal = wide_file("llama", "q4_0")
    groups = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
    with open_gguf(src) as s, open_gguf(cal) as c:
        for il in range(2):
            for name, group in zip(W.WIDE_TENSORS, groups):
                full = np.concatenate([dequantize(s.tensors[f"blk.{il}.{g}.weight"]).reshape(
                    s.tensors[f"blk.{il}.{g}.weight"].shape) for g in group])
                want = R.quantize_q8_tiles(np.ascontiguousarray(full.T))
                got = W.tiles_from_file(c.tensors, f"blk.{il}.{name}.weight")
                np.testing.assert_array_equal(got.q, want.q)
                np.testing.assert_array_equal(got.d, want.d)
                assert int(np.abs(got.q.astype(np.int16)).max()) <= 127 and (got.d >= 0).all()


def _q8_0_layout(src, cal, dst):
    """The layout of wide files written before the tiles: every I8 + scale pair of the (unrotated) calibrated file
    `cal` replaced by the Q8_0 of the dequantized source matrices stacked and transposed."""
    groups = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
    old = {}
    with open_gguf(src) as s:
        for il in range(2):
            for name, group in zip(W.WIDE_TENSORS, groups):
                full = np.concatenate([dequantize(s.tensors[f"blk.{il}.{g}.weight"]).reshape(
                    s.tensors[f"blk.{il}.{g}.weight"].shape) for g in group])
                t = np.ascontiguousarray(full.T)
                n = f"blk.{il}.{name}.weight"
                old[n] = Tensor(n, GGMLType.Q8_0, t.shape, R.quantize(t, GGMLType.Q8_0))
    with open_gguf(cal) as f:
        tensors = [old.get(t.name, t) for t in f.tensors.values() if not t.name.endswith(".scale")]
        write_gguf(dst, dict(f.metadata), tensors, types=dict(f.metadata_types), magic=f.magic, alignment=f.alignment)
    return dst


def test_an_old_q8_0_wide_file_loads_and_runs(wide_file, tmp_path):
    """A wide file with Q8_0 transposes (no .scale tensors) keeps the AXPY over Q8_0 rows: `off` within the
    re-encoding's error of the source, and the wide forward equal to the numpy reference with the same inputs
    zeroed."""
    src, cal = wide_file("llama", "q8_0", "plain")
    old = _q8_0_layout(src, cal, tmp_path / "old.gguf")
    with powerinfer_py.load(old, threads=1) as llm:
        assert all(isinstance(w, Tensor) and w.type == GGMLType.Q8_0 for lay in llm.model.wide for w in lay.w)
    want, _, _ = _logits(src, PROMPT)
    got, _, _ = _logits(old, PROMPT, sparse="off")
    rel = float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want ** 2)))
    assert 0 < rel < 0.03, rel
    ref, ref_kept = _reference_logits(src, old, PROMPT)
    got, st, sparse = _logits(old, PROMPT)
    assert sparse.mode == "wide"
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=5e-4 * float(np.abs(ref).max()))
    np.testing.assert_array_equal(st.kept, ref_kept)


@pytest.mark.parametrize("source", ("f32", "q4_0"))
def test_a_batch_gives_each_token_its_one_token_result(wide_file, source):
    """A batch reads the union of its tokens' kept rows, which must not change a token's result (Q8 tiles, for the
    quantized source, quantize each token's kept inputs on their own, per 32-input tile row); and the kept counts
    are those of one token at a time."""
    src, cal = wide_file("llama", source)
    with powerinfer_py.load(cal, threads=1, n_ctx=64) as llm:
        if source == "q4_0":
            assert all(isinstance(w, R.Q8Tiles) for lay in llm.model.wide for w in lay.w)
        cache = llm.model.new_cache(64)
        batch = llm.model.forward(np.asarray(PROMPT, np.int32), cache, all_logits=True)
        kept_batch = llm.sparsity_stats.kept.copy()
        llm.sparsity_stats.reset()
        cache = llm.model.new_cache(64)
        one = np.stack([llm.model.forward(np.asarray([t], np.int32), cache) for t in PROMPT])
        np.testing.assert_array_equal(llm.sparsity_stats.kept, kept_batch)
    np.testing.assert_allclose(batch, one, rtol=1e-5, atol=1e-5 * float(np.abs(one).max()))


def test_another_sparsity_at_run_time_follows_the_tables(wide_file):
    """A run may ask for another model-wide sparsity: the measured share of bytes skipped follows it (on the
    calibration text itself, where the tables were measured), and more sparsity means more skipped."""
    src, cal = wide_file("llama", "f32", "greedy")
    with powerinfer_py.load(cal, threads=1) as llm:
        ids = llm.tokenize(TEXT, add_bos=False)[:60]
    measured = []
    for s in (0.1, 0.25, 0.4, 0.6):
        with powerinfer_py.load(cal, threads=1, n_ctx=64, sparsity=s) as llm:
            assert llm.sparse.sparsity == s
            llm.model.forward(np.asarray(ids, np.int32), llm.model.new_cache(64))
            measured.append(llm.sparsity_stats.skipped_fraction)
    assert measured == sorted(measured)
    for s, m in zip((0.1, 0.25, 0.4, 0.6), measured):
        assert abs(m - s) < 0.1, (s, m)


def test_the_calibrated_metadata_and_criteria(wide_file):
    src, cal = wide_file("llama", "f32", "auto")
    with open_gguf(cal) as f:
        meta = dict(f.metadata)
    assert meta[W.KEY_CRITERION] in W.CRITERIA
    assert abs(float(meta[W.KEY_SPARSITY]) - 0.4) < 1e-6
    assert len(meta[W.KEY_QUANTILES]) == 2 * 4 * 101 and len(meta[W.KEY_ALLOC]) == 101 * 2 * 4
    assert (W.KEY_COL_NORMS + "0" in meta) == (meta[W.KEY_CRITERION] != "plain")


def test_greedy_allocation_meets_the_byte_target_and_prefers_cheap_inputs():
    levels = (0.25, 0.5, 0.75, 0.95)
    xs = np.array([0.0, *levels])
    curves = np.stack([xs ** 2 * 10, xs ** 2 * 0.1, xs ** 2, xs ** 2])  # kind 0 expensive, kind 1 cheap
    kind_bytes = np.array([100.0, 100.0, 100.0, 300.0])
    alloc = greedy_alloc(curves, kind_bytes, 3, levels)
    assert alloc.shape == (101, 3, 4)
    for g in (10, 30, 50, 70):
        s = W.GRID[g]
        np.testing.assert_allclose((alloc[g, 1] * kind_bytes).sum() / kind_bytes.sum(), s, atol=1e-5)
        assert alloc[g, 0, 1] >= alloc[g, 0, 2] >= alloc[g, 0, 0]
        np.testing.assert_array_equal(alloc[g, 0], alloc[g, 2])  # the same in every layer
    assert np.all(np.diff(alloc[:, 0, :], axis=0) >= -1e-6)  # each input's sparsity grows with the target
    assert float(alloc[-1].max()) == pytest.approx(0.95, abs=1e-6)
    u = uniform_alloc(3)
    assert u.shape == (101, 3, 4) and float(u[40, 2, 1]) == pytest.approx(0.4, abs=1e-6)
    assert float(u[-1].max()) == pytest.approx(0.95, abs=1e-6)


def test_loss_curves_cut_one_input_kind_at_a_time():
    q = np.tile(np.linspace(0, 1, 101, dtype=np.float32), (2, 4, 1))
    seen = []

    def eval_nll(cuts):
        seen.append(cuts.copy())
        return float(cuts.sum())

    f = loss_curves(eval_nll, q, (0.5,))
    assert len(seen) == 1 + 4 and not seen[0].any()
    for j in range(4):
        assert np.count_nonzero(seen[1 + j]) == 2 and np.all(seen[1 + j][:, j] > 0)
    np.testing.assert_allclose(f[:, 1], 2 * 0.5, rtol=1e-5)
