"""Tier 2 and 3 of the CPU kernels: the optional one-call C steps, reached as `CpuKernels.steps` (a CpuSteps).

A model's Python path, a loop of the per-op kernels (kernels.Ops), is the specification. Each step here does the
same work for one decode token in one C call, and each is tested bit-identical to that path (the FFN steps, the
attention block and the stack) or equal to float rounding (delta net, Mamba-2 scan):

    attn_block_plan / attn_block_decode      csrc/attn_block.c    tests/test_attn_block.py
    dense_ffn_plan / dense_ffn_decode        csrc/step_ffn.c    tests/test_sparse_ffn_fused.py
    sparse_ffn_plan / sparse_ffn_decode      csrc/step_ffn.c    tests/test_sparse_ffn_fused.py
    threshold_ffn_plan / threshold_ffn_decode csrc/step_ffn.c   tests/test_threshold.py, test_threshold_refine.py
    decode_stack_plan / decode_stack         csrc/step_stack.c  tests/test_decode_stack.py
    delta_net_plan / delta_net_decode        csrc/step_delta_net.c     tests/test_kernels_delta.py (kernels/delta_step.py)
    ssm_scan_step                            csrc/ssm_scan.c      tests/test_kernels_ssm_scan.py (kernels/ssm_step.py)

A plan checks one layer's weights once and describes them to C; decode runs one token through it. The steps share
their kernels object's thread pool and weight checks (CpuKernels._weight) and keep one scratch pair that every
step reuses (they run one after another). Validation happens here, on the Python side, as for the ops.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from .._pi import ffi, lib
from ..gguf.types import Tensor
from . import delta_step as _delta_step
from . import ref as _ref
from . import ssm_step as _ssm_step
from .checks import check_mscale, check_softcap

_F32, _F16, _I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
_FA, _HA, _IA = ffi.typeof("float[]"), ffi.typeof("uint16_t[]"), ffi.typeof("int32_t[]")
_fb = ffi.from_buffer
_SPARSE_DESC = ffi.typeof("pi_sparse_ffn *")


@dataclass(frozen=True)
class FfnStepPlan:
    """One FFN layer described to C (CpuSteps.sparse_ffn_plan; threshold_ffn_plan and dense_ffn_plan share the
    type): the pi_sparse_ffn or pi_ffn_step struct and the weight buffers it points into, kept alive with it.
    timing (predictor and exact plans): the step's running sums, f64 [4] = calls, seconds in the predictor (fc1,
    fc2, selection), seconds in the whole step, and the sum over calls of the share of the predictor's hidden
    units that were non-zero (pi_sparse_ffn.timing); None for others. up_read (threshold plans): where each
    decode call writes how many up rows it read (pi_ffn_step.up_read)."""
    desc: object  # cdata pi_sparse_ffn * (predictor / exact) or pi_ffn_step * (threshold, dense)
    buffers: tuple
    n_embd: int
    n_ff: int
    rank: int
    timing: np.ndarray | None = None
    up_read: np.ndarray | None = None  # threshold plans: int64 [1], the up rows the last decode call read


@dataclass(frozen=True)
class AttnBlockPlan:
    """One attention block described to C (CpuSteps.attn_block_plan), with the buffers it points into."""
    desc: object  # cdata pi_attn_block *
    buffers: tuple
    n_embd: int
    n_head_kv: int
    head_dim: int
    work_floats: int


class DecodeStackPlan:
    """A stack of decoder layers described to C once (CpuSteps.decode_stack_plan): the per-layer attention
    blocks, FFN steps and post-FFN norm weights as C pointer arrays, with what they point into. kinds: per layer
    "dense" (a dense_ffn_plan), "sparse" (a sparse_ffn_plan: predictor / exact) or "threshold" (a
    threshold_ffn_plan). The cache planes' pointers are made per set of planes (cache_pointers)."""

    KINDS = {"dense": 0, "sparse": 1, "threshold": 2}  # PI_STACK_DENSE, _SPARSE, _THRESHOLD

    def __init__(self, attn: list, ffn: list, kinds: list, post_norms: list, post_eps: float):
        self.n_layer = len(attn)
        self.n_embd = attn[0].n_embd
        self.attn_work = max(p.work_floats for p in attn)
        self.kinds = list(kinds)
        self.counted_layers = [il for il, k in enumerate(kinds) if k != "dense"]  # n_active / n_nonzero set
        self.work_floats = self.attn_work + 2 * self.n_embd + max(
            2 * p.rank + 3 * p.n_ff if k == "sparse" else 4 * p.n_ff if k == "threshold" else 2 * p.n_ff
            for p, k in zip(ffn, kinds))
        self.iwork_ints = max([p.rank + 2 * p.n_ff if k == "sparse" else 2 * p.n_ff
                               for p, k in zip(ffn, kinds) if k != "dense"] or [0])
        self.keep = (tuple(attn), tuple(ffn), tuple(n for n in post_norms if n is not None))
        self.attn = ffi.new("pi_attn_block *[]", [p.desc for p in attn])
        self.kind = ffi.new("int32_t[]", [self.KINDS[k] for k in kinds])
        self.ffn = ffi.new("pi_ffn_step *[]", [ffi.NULL if k == "sparse" else p.desc for p, k in zip(ffn, kinds)])
        self.sparse = ffi.new("pi_sparse_ffn *[]", [p.desc if k == "sparse" else ffi.NULL for p, k in zip(ffn, kinds)])
        self.post_norms = ffi.new("float *[]", [ffi.NULL if n is None else _fb(_FA, n) for n in post_norms])
        self.post_eps = float(post_eps)
        self.n_active = np.zeros(self.n_layer, np.int64)  # the counted layers' counts of the last call
        self.n_nonzero = np.zeros(self.n_layer, np.int64)
        self._counts = (ffi.cast("int64_t *", self.n_active.ctypes.data),
                        ffi.cast("int64_t *", self.n_nonzero.ctypes.data))
        # the last planes (weak references: a cache dropped by its owner is not kept alive here), their
        # pointer arrays and lengths
        self._planes = None

    def cache_pointers(self, k_planes, v_planes) -> tuple:
        """The C arrays of the cache planes' pointers and lengths, checked and made once per set of planes."""
        last = self._planes
        if last is not None and len(last[0]) == len(k_planes) == len(v_planes) and \
                all(r() is a for r, a in zip(last[0], k_planes)) and all(r() is a for r, a in zip(last[1], v_planes)):
            return last[2], last[3], last[4]
        if len(k_planes) != self.n_layer or len(v_planes) != self.n_layer:
            raise ValueError(f"decode_stack: {len(k_planes)} / {len(v_planes)} cache planes for {self.n_layer} layers")
        for il, (kc, vc) in enumerate(zip(k_planes, v_planes)):
            for nm, c in (("k", kc), ("v", vc)):
                if not (type(c) is np.ndarray and c.dtype is _F16 and c.flags.c_contiguous and c.flags.writeable
                        and c.ndim == 3 and c.shape == kc.shape
                        and c.shape[0] == self.keep[0][il].n_head_kv and c.shape[2] == self.keep[0][il].head_dim):
                    raise ValueError(f"decode_stack: layer {il}'s {nm} cache plane must be a writable C-contiguous "
                                     "float16 array [n_head_kv, n_ctx, head_dim] like its other plane")
        kp = ffi.new("uint16_t *[]", [_fb(_HA, c) for c in k_planes])
        vp = ffi.new("uint16_t *[]", [_fb(_HA, c) for c in v_planes])
        n_ctx = np.array([c.shape[1] for c in k_planes], dtype=np.int64)
        self._planes = ([weakref.ref(c) for c in k_planes], [weakref.ref(c) for c in v_planes], kp, vp, n_ctx)
        return kp, vp, n_ctx


class CpuSteps:
    """The one-call decode steps of a CpuKernels (its `steps`): they run on that object's thread pool, which
    they reach through a weak reference (no cycle: the pool is freed when its kernels object goes), and fail
    with "closed" once it is closed."""

    # ---- shared checks and scratch --------------------------------------------------------------------------

    def __init__(self, kernels):
        self._kernels = weakref.ref(kernels)
        self._work = None  # (f32 scratch, int32 scratch), grown on demand

    @property
    def _pool(self):
        k = self._kernels()
        return None if k is None else k._pool

    def _weight(self, w: Tensor) -> tuple:
        """The kernels object's checked view of a weight (its cache: each weight is checked once)."""
        k = self._kernels()
        if k is None:
            raise ValueError("this CpuKernels has been closed")
        return k._weight(w)

    def _step_work(self, n_f32: int, n_i32: int = 0) -> tuple:
        """cdata pointers to the step scratch, grown to f32 [n_f32] and int32 [n_i32] (one pair serves every
        step: they run one after another)."""
        if self._pool is None:
            raise ValueError("this CpuKernels has been closed")
        w = self._work
        if w is None or w[0].size < n_f32 or w[1].size < n_i32:
            old = (0, 0) if w is None else (w[0].size, w[1].size)
            w = self._work = (np.empty(max(n_f32, old[0], 1), _F32), np.empty(max(n_i32, old[1], 1), _I32))
        return _fb(_FA, w[0]), _fb(_IA, w[1])

    @staticmethod
    def _check_step_vector(op: str, name: str, v, n: int, writable: bool = False) -> None:
        if not (type(v) is np.ndarray and v.dtype is _F32 and v.flags.c_contiguous and v.shape == (n,)
                and (v.flags.writeable or not writable)):
            raise ValueError(f"{op}: {name} must be a{' writable' if writable else ''} C-contiguous float32 array of "
                             f"shape ({n},), got {getattr(v, 'dtype', type(v).__name__)} {getattr(v, 'shape', '')}")

    # ---- one decode step of a LLaMA attention block (step_attn.c) -----------------------------------------

    def attn_block_plan(self, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor, attn_norm, ffn_norm, *,
                        n_head: int, n_head_kv: int, head_dim: int, n_rot: int, rope_base: float,
                        rope_scale: float, rope_neox: bool, eps: float, attn_scale: float, q_norm=None,
                        k_norm=None, post_norm=None, window: int = 0, bq=None, bk=None, bv=None,
                        rope_freqs=None, rope_mscale: float = 1.0, attn_softcap: float = 0.0,
                        qk_norm_full: bool = False, residual_scale: float = 1.0, bo=None,
                        sinks=None, qk_norm_post_rope: bool = False, v_norm: bool = False) -> "AttnBlockPlan":
        """Checks one layer's attention weights once and describes them to C for attn_block_decode. q_norm,
        k_norm (f32 [head_dim]), post_norm (f32 [n_embd]) and a sliding window are gemma3's extras; bq, bk, bv
        (f32 [n_head * head_dim], [n_head_kv * head_dim] x 2) qwen2's; rope_freqs (f32 [n_rot/2], RoPE
        frequency factors) LLaMA 3.1+'s; rope_mscale (scale of the rotated dims) YaRN's; attn_softcap (attention
        logit soft-cap, 0 = off) gemma2's. olmo2: attn_norm and ffn_norm None (no pre-norms) and qk_norm_full
        (q_norm, k_norm f32 [n_head * head_dim], [n_head_kv * head_dim], each one RMSNorm over all of q, k).
        residual_scale (the block's output is multiplied by it before it is added to x, 1 = none): granite's.
        bo (f32 [n_embd], the output projection's bias) and sinks (f32 [n_head], attention sink logits): gpt-oss's.
        qk_norm_post_rope: q_norm, k_norm applied after RoPE instead of before (hunyuan-dense).
        gemma4 / gemma3n: v_norm (a weightless per-head RMSNorm of v); wv None (v is Wk h before k's norm); wk and
        wv None (the layer shares another's K/V: decode then takes that layer's cache planes and writes none)."""
        n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
        if wk is None and (wv is not None or bk is not None or bv is not None or k_norm is not None):
            raise ValueError("attn_block_plan: a layer without wk (sharing another's K/V) takes no wv, bk, bv, k_norm")
        if wv is None and bv is not None:
            raise ValueError("attn_block_plan: bv given without wv")
        infos = {nm: self._weight(t) for nm, t in (("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo)) if t is not None}
        n_embd = infos["wq"][4]
        want = {"wq": (n_q, n_embd), "wk": (n_kv, n_embd), "wv": (n_kv, n_embd), "wo": (n_embd, n_q)}
        for nm, (_, _, _, rows, cols) in infos.items():
            if (rows, cols) != want[nm]:
                raise ValueError(f"attn_block_plan: {nm} has {rows} x {cols} values, expected {want[nm][0]} x "
                                 f"{want[nm][1]}")
        norms = []
        q_norm_dim, k_norm_dim = (n_q, n_kv) if qk_norm_full else (head_dim, head_dim)
        for nm, v, dim, optional in (("attn_norm", attn_norm, n_embd, True), ("ffn_norm", ffn_norm, n_embd, True),
                                     ("q_norm", q_norm, q_norm_dim, True), ("k_norm", k_norm, k_norm_dim, True),
                                     ("post_norm", post_norm, n_embd, True), ("bq", bq, n_q, True),
                                     ("bk", bk, n_kv, True), ("bv", bv, n_kv, True),
                                     ("rope_freqs", rope_freqs, n_rot // 2, True), ("bo", bo, n_embd, True),
                                     ("sinks", sinks, n_head, True)):
            if optional and v is None:
                norms.append(ffi.NULL)
                continue
            if not (type(v) is np.ndarray and v.dtype is _F32 and v.flags.c_contiguous and v.shape == (dim,)):
                raise ValueError(f"attn_block_plan: {nm} must be a C-contiguous float32 array of shape ({dim},)")
            norms.append(_fb(_FA, v))
        if window < 0:
            raise ValueError(f"attn_block_plan: window must be >= 0, got {window}")
        if n_head % n_head_kv or n_rot % 2 or not 0 <= n_rot <= head_dim or not eps >= 0 or not rope_base > 0:
            raise ValueError(f"attn_block_plan: bad attention shape or RoPE settings (n_head {n_head}, n_head_kv "
                             f"{n_head_kv}, head_dim {head_dim}, n_rot {n_rot}, base {rope_base}, eps {eps})")
        desc = ffi.new("pi_attn_block *")
        desc.n_embd, desc.n_head, desc.n_head_kv, desc.head_dim, desc.n_rot = n_embd, n_head, n_head_kv, head_dim, n_rot
        desc.eps, desc.rope_base, desc.rope_scale, desc.attn_scale = eps, rope_base, rope_scale, attn_scale
        desc.rope_neox = 1 if rope_neox else 0
        desc.qk_norm_full = 1 if qk_norm_full else 0
        desc.qk_norm_post_rope = 1 if qk_norm_post_rope else 0
        (desc.attn_norm, desc.ffn_norm, desc.q_norm, desc.k_norm, desc.post_norm, desc.bq, desc.bk, desc.bv,
         desc.rope_ff, desc.bo, desc.sinks) = norms
        desc.window = window
        desc.rope_mscale = check_mscale("attn_block_plan", rope_mscale)
        desc.attn_softcap = check_softcap("attn_block_plan", attn_softcap)
        if not (math.isfinite(residual_scale) and residual_scale != 0):
            raise ValueError(f"attn_block_plan: residual_scale must be finite and non-zero, got {residual_scale}")
        desc.res_scale = residual_scale
        desc.v_norm = 1 if v_norm else 0
        desc.wk = desc.wv = ffi.NULL
        for nm, (_, wp, ty, _, _) in infos.items():
            setattr(desc, nm, wp)
            setattr(desc, f"{nm}_type", ty)
        keep = tuple(info[1] for info in infos.values()) + tuple(n for n in norms if n != ffi.NULL)
        return AttnBlockPlan(desc, keep, n_embd,
                             n_head_kv, head_dim, 2 * n_embd + 2 * n_q + 2 * n_kv)

    def attn_block_decode(self, plan: "AttnBlockPlan", x, pos: int, k_cache, v_cache) -> np.ndarray:
        """One token through a planned attention block: x f32 [n_embd] (the residual) gets the block's output
        added in place, the token's K/V go to position pos of the f16 cache planes [n_head_kv, n_ctx, head_dim];
        returns the FFN's input rmsnorm(x) * ffn_norm. Bit-identical to the separate kernels."""
        self._check_step_vector("attn_block_decode", "x", x, plan.n_embd, writable=True)
        for nm, c in (("k_cache", k_cache), ("v_cache", v_cache)):
            if not (type(c) is np.ndarray and c.dtype is _F16 and c.flags.c_contiguous and c.flags.writeable
                    and c.ndim == 3 and c.shape[0] == plan.n_head_kv and c.shape[2] == plan.head_dim
                    and c.shape == k_cache.shape):
                raise ValueError(f"attn_block_decode: {nm} must be a writable C-contiguous float16 array "
                                 f"[{plan.n_head_kv}, n_ctx, {plan.head_dim}] like the other cache plane")
        if not 0 <= pos < k_cache.shape[1]:
            raise ValueError(f"attn_block_decode: position {pos} is outside the cache (n_ctx {k_cache.shape[1]})")
        fwork, _ = self._step_work(plan.work_floats)
        out = np.empty(plan.n_embd, _F32)
        lib.pi_attn_block_decode(self._pool, plan.desc, _fb(_FA, x), pos, _fb(_HA, k_cache), _fb(_HA, v_cache),
                                 k_cache.shape[1], fwork, _fb(_FA, out))
        return out

    # ---- one token through a stack of layers (step_stack.c) ------------------------------------------------

    def decode_stack_plan(self, attn: list, ffn: list, post_norms: list, post_eps: float,
                          kinds: list | None = None) -> DecodeStackPlan:
        """Per layer an attn_block_plan, an FFN step and the f32 [n_embd] weight of a norm on the FFN's output
        (None: no norm), described to C for decode_stack. kinds: per layer "dense" (a dense_ffn_plan; the
        default), "sparse" (a sparse_ffn_plan: predictor / exact) or "threshold" (a threshold_ffn_plan)."""
        kinds = ["dense"] * len(ffn) if kinds is None else list(kinds)
        if not (len(attn) == len(ffn) == len(post_norms) == len(kinds)) or not attn:
            raise ValueError("decode_stack_plan: one attention plan, FFN plan, kind and post-norm entry per layer")
        n_embd = attn[0].n_embd
        for il, (a, f, k, n) in enumerate(zip(attn, ffn, kinds, post_norms)):
            if k not in DecodeStackPlan.KINDS:
                raise ValueError(f"decode_stack_plan: layer {il}'s kind {k!r} is not one of "
                                 f"{', '.join(DecodeStackPlan.KINDS)}")
            if (ffi.typeof(f.desc) is _SPARSE_DESC) != (k == "sparse") or (k == "dense" and f.desc.down_transposed):
                raise ValueError(f"decode_stack_plan: layer {il}'s FFN plan is not a {k} step")
            if a.n_embd != n_embd or f.n_embd != n_embd:
                raise ValueError(f"decode_stack_plan: layer {il} has n_embd {a.n_embd} / {f.n_embd}, not {n_embd}")
            if n is not None and not (type(n) is np.ndarray and n.dtype is _F32 and n.flags.c_contiguous
                                      and n.shape == (n_embd,)):
                raise ValueError(f"decode_stack_plan: layer {il}'s post-FFN norm must be float32 [{n_embd}]")
        return DecodeStackPlan(attn, ffn, kinds, post_norms, post_eps)

    def decode_stack(self, plan: DecodeStackPlan, x, pos: int, k_planes, v_planes) -> None:
        """One token through every layer of the plan: x f32 [n_embd] (the residual) updated in place, each layer's
        K/V written at position pos of its cache planes; the sparse and threshold layers' counts (active or kept,
        non-zero h) left in plan.n_active / plan.n_nonzero. The bits of attn_block_decode, the FFN step, the
        post-FFN rmsnorm and x += y called layer by layer."""
        self._check_step_vector("decode_stack", "x", x, plan.n_embd, writable=True)
        kp, vp, n_ctx = plan.cache_pointers(k_planes, v_planes)
        if not 0 <= pos < int(n_ctx.min()):
            raise ValueError(f"decode_stack: position {pos} is outside the cache (n_ctx {int(n_ctx.min())})")
        fwork, iwork = self._step_work(plan.work_floats, plan.iwork_ints)
        lib.pi_decode_stack(self._pool, plan.n_layer, plan.attn, plan.kind, plan.ffn, plan.sparse, plan.post_norms,
                            plan.post_eps, _fb(_FA, x), pos, kp, vp, ffi.cast("int64_t *", n_ctx.ctypes.data), fwork,
                            plan.attn_work, iwork, *plan._counts)

    # ---- one decode token of a gated delta-net layer (step_delta_net.c; kernels/delta_step.py) ------------------

    def delta_net_plan(self, *args, **kw) -> "_delta_step.DeltaNetPlan":
        """One delta-net layer's constants checked and described to C once (delta_step.delta_net_plan)."""
        return _delta_step.delta_net_plan(*args, **kw)

    def delta_net_decode(self, plan: "_delta_step.DeltaNetPlan", qkv, z, beta_raw, alpha_raw, conv_state,
                         state) -> np.ndarray:
        """One token through a planned delta-net layer, states updated in place (delta_step.delta_net_decode)."""
        work, _ = self._step_work(plan.work_floats)
        return _delta_step.delta_net_decode(self._pool, work, plan, qkv, z, beta_raw, alpha_raw, conv_state, state)

    def ssm_scan_step(self, S, x, dt, A, B, C) -> np.ndarray:
        """One token of the Mamba-2 scan, S updated in place; returns y [H, P] (ssm_step.ssm_scan_step)."""
        if self._pool is None:
            raise ValueError("this CpuKernels has been closed")
        return _ssm_step.ssm_scan_step(self._pool, S, x, dt, A, B, C)

    # ---- one decode step of a threshold-mode SwiGLU/GeGLU FFN (step_ffn.c) ------------------------------

    def threshold_ffn_plan(self, act: str, gate: Tensor, up: Tensor, down: Tensor, down_transposed: bool,
                           cut: float, scale=None, up_cut: float | None = None) -> FfnStepPlan:
        """Checks one layer's weights once and describes them to C for threshold_ffn_decode. act: "silu" or
        "gelu"; down: ffn_down [n_embd, n_ff], or its transposed copy [n_ff, n_embd] when down_transposed.
        up_cut (two-stage files): candidates by the score >= up_cut, kept by |h| >= cut (threshold.py)."""
        if act not in ("silu", "gelu"):
            raise ValueError(f"threshold_ffn_plan: act must be 'silu' or 'gelu', got {act!r}")
        g, u, d = self._weight(gate), self._weight(up), self._weight(down)
        n_ff, n_embd = g[3], g[4]
        want_down = (n_ff, n_embd) if down_transposed else (n_embd, n_ff)
        for nm, info, want in (("up", u, (n_ff, n_embd)), ("down", d, want_down)):
            if (info[3], info[4]) != want:
                raise ValueError(f"threshold_ffn_plan: {nm} has {info[3]} x {info[4]} values, expected {want[0]} x "
                                 f"{want[1]}")
        buffers = [g[1], u[1], d[1]]
        desc = ffi.new("pi_ffn_step *")
        desc.act, desc.cut = (1 if act == "gelu" else 0), cut
        desc.scale = ffi.NULL
        desc.refine, desc.up_cut = (0, 0.0) if up_cut is None else (1, up_cut)
        if scale is not None:
            if not (type(scale) is np.ndarray and scale.dtype is _F32 and scale.flags.c_contiguous
                    and scale.shape == (n_ff,)):
                raise ValueError(f"threshold_ffn_plan: scale must be a C-contiguous float32 array of shape ({n_ff},)")
            buffers.append(_fb(_FA, scale))
            desc.scale = buffers[-1]
        desc.n_embd, desc.n_ff = n_embd, n_ff
        desc.gate_type, desc.up_type, desc.down_type = g[2], u[2], d[2]
        desc.gate, desc.up, desc.down = g[1], u[1], d[1]
        desc.down_transposed = 1 if down_transposed else 0
        up_read = np.zeros(1, dtype=np.int64)  # each call's up rows read (FfnStepPlan.up_read)
        buffers.append(up_read)
        desc.up_read = ffi.cast("int64_t *", up_read.ctypes.data)
        return FfnStepPlan(desc, tuple(buffers), n_embd, n_ff, 0, up_read=up_read)

    def threshold_ffn_decode(self, plan: FfnStepPlan, x) -> tuple[np.ndarray, int, int]:
        """One token through a planned threshold FFN: (y f32 [n_embd], kept count, non-zero h count) for x the
        normed FFN input f32 [n_embd]. Bit-identical to the separate kernels in threshold.py's order."""
        self._check_step_vector("threshold_ffn_decode", "x", x, plan.n_embd)
        fwork, iwork = self._step_work(4 * plan.n_ff, 2 * plan.n_ff)
        y = np.empty(plan.n_embd, _F32)
        nz = ffi.new("int64_t *")
        n_kept = lib.pi_threshold_ffn_decode(self._pool, plan.desc, _fb(_FA, x), fwork, iwork, _fb(_FA, y), nz)
        return y, int(n_kept), int(nz[0])

    def dense_ffn_plan(self, act: str, gate: Tensor, up: Tensor, down: Tensor) -> FfnStepPlan:
        """A dense SwiGLU/GeGLU FFN described to C for dense_ffn_decode (the threshold description, no cut)."""
        return self.threshold_ffn_plan(act, gate, up, down, False, 0.0)

    def dense_ffn_decode(self, plan: FfnStepPlan, x) -> np.ndarray:
        """One token through a dense SwiGLU/GeGLU FFN planned by dense_ffn_plan: y f32 [n_embd] =
        down . (act(gate . x) * (up . x)), the separate kernels' bits."""
        if plan.desc.down_transposed:
            raise ValueError("dense_ffn_decode: the plan's down projection must be ffn_down, not a transposed copy")
        self._check_step_vector("dense_ffn_decode", "x", x, plan.n_embd)
        fwork, _ = self._step_work(2 * plan.n_ff)
        y = np.empty(plan.n_embd, _F32)
        lib.pi_dense_ffn_decode(self._pool, plan.desc, _fb(_FA, x), fwork, _fb(_FA, y))
        return y

    # ---- one decode step of a predictor-driven FFN (step_ffn.c) -----------------------------------------
    FUSED_VARIANTS = {"reglu": 0, "fatreglu": 1, "dreglu": 2}  # enum pi_ffn_variant

    def sparse_ffn_plan(self, variant: str, fc1: Tensor | None, fc2: Tensor | None, gate: Tensor, up: Tensor,
                        down_t: Tensor, threshold: float, act_param: float = 0.0,
                        exact: bool = False, fc2_t: Tensor | None = None) -> FfnStepPlan:
        """Checks one layer's weights once and describes them to C for sparse_ffn_decode. exact: no predictor
        (fc1, fc2 None): every neuron's gate is computed and the non-zero ones are live. fc2_t: fc2 transposed
        (rank, n_ff), the same values, for the AXPY over the predictor's non-zero hidden units (ffn.py)."""
        if variant not in self.FUSED_VARIANTS:
            raise ValueError(f"sparse_ffn_plan: variant {variant!r} is not one of {', '.join(self.FUSED_VARIANTS)}")
        named = (("gate", gate), ("up", up), ("down_t", down_t))
        if not exact:
            if fc1 is None or fc2 is None:
                raise ValueError("sparse_ffn_plan: predictor mode needs fc1 and fc2")
            named = (("fc1", fc1), ("fc2", fc2)) + named
            if fc2_t is not None and not isinstance(fc2_t, _ref.FC2T):
                named += (("fc2_t", fc2_t),)
        infos = {nm: self._weight(t) for nm, t in named}
        n_ff, n_embd = infos["gate"][3], infos["gate"][4]
        rank = 0 if exact else infos["fc1"][3]
        want = {"fc1": (rank, n_embd), "fc2": (n_ff, rank), "gate": (n_ff, n_embd), "up": (n_ff, n_embd),
                "down_t": (n_ff, n_embd), "fc2_t": (rank, n_ff)}
        if not exact and infos["fc1"][4] != n_embd:
            raise ValueError(f"sparse_ffn_plan: fc1 has {infos['fc1'][4]} columns, the FFN input has {n_embd}")
        for nm, (_, _, _, rows, cols) in infos.items():
            if (rows, cols) != want[nm]:
                raise ValueError(f"sparse_ffn_plan: {nm} has {rows} x {cols} values, expected {want[nm][0]} x "
                                 f"{want[nm][1]}")
        desc = ffi.new("pi_sparse_ffn *")
        desc.variant, desc.act_param, desc.threshold = self.FUSED_VARIANTS[variant], act_param, threshold
        desc.exact = 1 if exact else 0
        desc.n_embd, desc.n_ff, desc.rank = n_embd, n_ff, rank
        for nm, (_, wp, ty, _, _) in infos.items():
            setattr(desc, nm, wp)
            setattr(desc, "down_type" if nm == "down_t" else f"{nm}_type", ty)
        keep = tuple(info[1] for info in infos.values())
        timing = np.zeros(4, np.float64)
        desc.timing = ffi.from_buffer("double[]", timing)
        if not exact and isinstance(fc2_t, _ref.FC2T):  # a quantized fc2's copy by hidden unit (fc2t_pack)
            if (fc2_t.n_ff, fc2_t.rank) != (n_ff, rank):
                raise ValueError(f"sparse_ffn_plan: fc2_t is a copy of a {fc2_t.n_ff} x {fc2_t.rank} fc2, "
                                 f"expected {n_ff} x {rank}")
            _ref.check_fc2t_copy(fc2_t)
            buf = ffi.from_buffer(fc2_t.data)
            desc.fc2_t, desc.fc2_t_type = buf, lib.PI_FC2T + int(fc2_t.type)
            keep += (buf,)
        # the cdata pointers kept keep the weight buffers alive as long as the plan
        return FfnStepPlan(desc, keep, n_embd, n_ff, rank, timing)

    def sparse_ffn_decode(self, plan: FfnStepPlan, x, p) -> tuple[np.ndarray, int, int]:
        """One token through a planned FFN: (y f32 [n_embd], predicted-active count, non-zero h count) for x
        the normed FFN input and p the predictor input (f32 [n_embd] each). Bit-identical to the separate
        kernels in ffn.py's order."""
        for nm, v in (("x", x), ("p", p)):
            self._check_step_vector("sparse_ffn_decode", nm, v, plan.n_embd)
        fwork, iwork = self._step_work(2 * plan.rank + 3 * plan.n_ff, plan.rank + 2 * plan.n_ff)
        y = np.empty(plan.n_embd, _F32)
        nz = ffi.new("int64_t *")
        n_active = lib.pi_sparse_ffn_decode(self._pool, plan.desc, _fb(_FA, x), _fb(_FA, p), fwork, iwork,
                                            _fb(_FA, y), nz)
        return y, int(n_active), int(nz[0])
