"""Hot/cold neuron placement: which FFN neurons of each layer live in device memory under a VRAM budget.

What lives on the device (docs/FORMATS.md section 3; the issue's hybrid layout):
  1. first, everything that is not an FFN neuron: attention weights, norms, predictors (fc1/fc2), the output
     head (token_embd too when the head is tied; otherwise the embedding lookup stays on the host), other
     small tensors (biases of ffn_down_t, ...), the f16 KV cache for n_ctx positions, the per-layer index maps
     (int32 [n_ff]: neuron -> compact row, what a device-side split of the active list needs) and the scratch
     buffers of one decode step (scratch_buffers() names them);
  2. then, in what is left, the hot neurons: for a neuron i of layer l, row i of ffn_gate, ffn_up and
     ffn_down_t in their actual storage types (and its ffn_up.bias value, f32, when the model has one).

Exact accounting. The device executor takes ONE arena of footprint.arena_bytes(plan) <= budget bytes and
carves every buffer out of it at 16-byte alignment (ALIGN: what 128-bit loads need). Fixed buffers are
rounded up to 16 bytes each. Hot neurons are taken in groups of GROUP = 32 (one warp: one row per lane in the
row-gather kernels, so no lane idles on a partial group): 32 rows of any kernel type are a multiple of 16
bytes (F16: 64*K, Q8_0: 34*K, Q4_0: 18*K bytes with K a multiple of 32; the planar device layout splits the
quantized blocks into a scale plane of 2*K/32 bytes per row and a quant plane, each again a multiple of 16 per
32 rows), so a group costs exactly 32 * neuron_bytes with no padding and the arena size is linear in the
number of groups. A layer whose n_ff is not a multiple of 32 pays for its last group as if it were full
(the padding rows are allocated, zeroed and never listed as active).

The optimisation, per layer l with neuron activation counts c_l (from PowerInfer's activation_N.pt files or
our own profile): sort c_l descending and cut it into groups of 32; group g's value v_lg is the sum of its
counts, so v_l0 >= v_l1 >= ... . Choose m_l groups per layer (the top 32*m_l neurons of the layer go to the
device) to maximise  sum_l sum_{g < m_l} v_lg  subject to  sum_l m_l * w_l <= B, with w_l = 32 * neuron
bytes of layer l and B the budget left after the fixed buffers. solve_groups() solves it exactly:

  * One cost class (every layer has the same w: the usual case, one dtype for all FFN weights): take the
    floor(B / w) groups of largest value over all layers, ties by (layer, group index). Optimal: any feasible
    choice holds at most floor(B / w) groups, whose values sum to at most the sum of the floor(B / w) largest
    values; and because values never increase along a layer, the largest ones (with ties taken in group
    order) form a prefix of every layer, so they are a feasible choice. (Groups of value 0 are left out: they
    add nothing and would only cost memory.)
  * Two cost classes (e.g. Q4_0 layers next to Q8_0 ones): within a class the argument above holds for any
    number of groups it gets, so the optimum is max over m_a (groups given to class a) of
    P_a(m_a) + P_b(floor((B - m_a w_a) / w_b)), P the prefix sums of the class's sorted values: an
    enumeration of m_a, exact.
  * Three or more classes: by the same argument only the number of groups per class is left to choose:
    maximise sum_c P_c(m_c) under sum_c w_c m_c <= B. Each P_c is concave, so it equals the minimum of its
    chords at integer points, which makes this an exact mixed-integer program with one integer per class,
    solved by scipy.optimize.milp (HiGHS) when scipy is installed. scipy is optional: without it this case
    raises a PowerInferError saying so. It is the slow case (about 30-50 s for 80 layers x 28672 neurons on
    a 2-core machine, against milliseconds for one or two classes; a per-group 0/1 program took 150 s).
Upstream's knapsack over 256-neuron groups of a neuron capacity is the same formulation with w equal for all
layers; we differ by 32-neuron groups, byte (not neuron) capacity and layers read in numeric order.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..config import ModelConfig
from ..errors import ModelFileError, PowerInferError
from ..gguf.types import Tensor

GROUP = 32  # neurons per placement group: one warp, one row per lane
ALIGN = 16  # bytes: arena sub-allocation alignment (128-bit loads)
AXPY_SPLITS = 64  # the device AXPY's neuron splits; each writes a partial [n_embd] (csrc/cuda/axpy.cu)
NEURON_TENSORS = ("ffn_gate.weight", "ffn_up.weight", "ffn_down_t.weight")
MIB = 1 << 20
GIB = 1 << 30


def aligned(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


def scratch_buffers(c: ModelConfig, n_ctx: int) -> dict[str, int]:
    """Bytes of each device scratch buffer of one decode step (f32 unless noted), before alignment."""
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    rank = max(c.predictor_ranks or (0,))
    return {
        "x (residual)": 4 * c.n_embd, "normed input": 4 * c.n_embd, "ffn output": 4 * c.n_embd,
        "q": 4 * q_dim, "k": 4 * kv_dim, "v": 4 * kv_dim, "attention output": 4 * q_dim,
        "predictor hidden": 4 * rank, "predictor logits": 4 * c.n_ff, "gate values": 4 * c.n_ff,
        "up values": 4 * c.n_ff, "ffn activations": 4 * c.n_ff,
        "active list (int32, + count)": 4 * (c.n_ff + 1), "axpy partials": 4 * AXPY_SPLITS * c.n_embd,
        "positions (int32)": 4, "logits": 4 * c.n_vocab,
    }


@dataclass
class Footprint:
    """Device bytes of a sparse model in the hybrid layout (see the module docstring)."""
    fixed: dict[str, int]  # category -> bytes, each buffer already rounded up to ALIGN
    neuron_bytes: list[int]  # per layer: bytes of one hot neuron (its gate/up/down_t rows, + up bias)
    n_ff: int

    @property
    def fixed_bytes(self) -> int:
        return sum(self.fixed.values())

    def group_costs(self) -> list[int]:
        return [GROUP * b for b in self.neuron_bytes]

    def layer_bytes(self, n_hot: int, il: int) -> int:
        """Device bytes of n_hot neurons of layer il (whole groups)."""
        return -(-n_hot // GROUP) * GROUP * self.neuron_bytes[il]

    def arena_bytes(self, n_hot: Sequence[int]) -> int:
        return self.fixed_bytes + sum(self.layer_bytes(k, il) for il, k in enumerate(n_hot))


def footprint(config: ModelConfig, tensors: Mapping[str, Tensor], n_ctx: int) -> Footprint:
    """The device footprint of a PWRI model's tensors (name -> Tensor, as the loader gives them) for n_ctx."""
    c = config
    if not c.is_sparse:
        raise PowerInferError("hot/cold placement needs a PowerInfer (PWRI) model with ffn_down_t and "
                              "predictors; this is a dense GGUF file")
    if n_ctx < 1:
        raise PowerInferError(f"n_ctx must be at least 1, got {n_ctx}")
    fixed = {k: 0 for k in ("attention", "norms", "predictors", "output head", "other")}
    neuron = [0] * c.n_layer
    layer_re = re.compile(r"blk\.(\d+)\.(.+)$")
    for name, t in tensors.items():
        m = layer_re.match(name)
        suffix = m.group(2) if m else name
        if m and suffix in NEURON_TENSORS + ("ffn_up.bias",):
            if t.shape[0] != c.n_ff or t.nbytes % c.n_ff:
                raise ModelFileError(f"tensor {name!r} of shape {t.shape} has no row per FFN neuron ({c.n_ff})")
            neuron[int(m.group(1))] += t.nbytes // c.n_ff
            continue
        if name == "token_embd.weight":
            if c.tied_output:
                fixed["output head"] += aligned(t.nbytes)
            continue  # the lookup is a row copy on the host
        if suffix.startswith("attn_") and not suffix.startswith("attn_norm"):
            cat = "attention"
        elif "norm" in suffix:
            cat = "norms"
        elif suffix.startswith(("fc1.", "fc2.")):
            cat = "predictors"
        elif name == "output.weight":
            cat = "output head"
        else:
            cat = "other"
        fixed[cat] += aligned(t.nbytes)
    fixed["kv cache (f16)"] = c.n_layer * 2 * aligned(2 * c.n_head_kv * n_ctx * c.head_dim)
    fixed["index maps (int32)"] = c.n_layer * aligned(4 * c.n_ff)
    fixed["scratch"] = sum(aligned(b) for b in scratch_buffers(c, n_ctx).values())
    return Footprint(fixed, neuron, c.n_ff)


# ---- the exact solver -------------------------------------------------------------------------------------

def group_values(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, values): neurons by descending count (ties: lower index first) and the masses of the
    consecutive 32-neuron groups of that order (non-increasing)."""
    counts = np.asarray(counts, dtype=np.float64)
    order = np.argsort(-counts, kind="stable")
    n_groups = -(-len(counts) // GROUP)
    padded = np.zeros(n_groups * GROUP)
    padded[:len(counts)] = counts[order]
    return order, padded.reshape(n_groups, GROUP).sum(axis=1)


def solve_groups(values: Sequence[np.ndarray], costs: Sequence[int], capacity: int) -> list[int]:
    """Groups per layer maximising the total value of each layer's leading groups under sum m_l * costs[l]
    <= capacity (values[l] non-increasing, >= 0; costs > 0). Exact: see the module docstring."""
    if capacity < 0:
        raise ValueError("capacity must be >= 0")
    classes: dict[int, list[int]] = {}
    for il, w in enumerate(costs):
        if w <= 0:
            raise ValueError(f"layer {il}: the group cost must be positive, got {w}")
        classes.setdefault(int(w), []).append(il)
    m = [0] * len(values)
    pools = []  # per class: (cost, layer of each group in the class's best-first order, prefix sums of values)
    for w, layers in classes.items():
        layer_of = np.concatenate([np.full(np.count_nonzero(values[il] > 0), il) for il in layers] or [[]])
        vals = np.concatenate([values[il][values[il] > 0] for il in layers] or [[]])
        gidx = np.concatenate([np.arange(np.count_nonzero(values[il] > 0)) for il in layers] or [[]])
        order = np.lexsort((gidx, layer_of, -vals))  # value desc, then layer, then group index
        pools.append((w, layer_of[order].astype(np.int64), np.concatenate([[0.0], np.cumsum(vals[order])])))
    if len(pools) == 1:
        (w, layer_of, _), = pools
        take = [min(len(layer_of), capacity // w)]
    elif len(pools) == 2:
        (wa, la, pa), (wb, lb, pb) = pools
        ma = np.arange(min(len(la), capacity // wa) + 1)
        mb = np.minimum(len(lb), (capacity - ma * wa) // wb)
        total = pa[ma] + pb[mb]
        best = np.flatnonzero(total == total.max())
        i = best[np.argmin(ma[best] * wa + mb[best] * wb)]  # among optima, the fewest bytes
        take = [int(ma[i]), int(mb[i])]
    else:
        take = _solve_classes_milp(pools, capacity)
    for (_, layer_of, _), k in zip(pools, take):
        for il in layer_of[:k]:
            m[int(il)] += 1
    return m


def _solve_classes_milp(pools, capacity: int) -> list[int]:
    """Groups per cost class, three or more classes: maximise sum_c P_c(m_c) s.t. sum_c w_c m_c <= capacity,
    m_c integer in [0, G_c]. P_c is concave (prefix sums of non-increasing values), so at integer m_c it equals
    the minimum of its chords: t_c <= P_c(k) + v_c,k (m_c - k) for every k, an exact MILP with one integer per
    class (HiGHS through scipy.optimize.milp)."""
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
    except ImportError:
        raise PowerInferError("the FFN weights have three or more different bytes per neuron across layers; "
                              "the exact placement for that case needs scipy (pip install scipy)") from None
    n_cls = len(pools)
    rows, cols, data, upper = [], [], [], []
    r = 0
    for c, (_, layer_of, prefix) in enumerate(pools):
        slopes = np.diff(prefix)  # v_c,k for k = 0 .. G_c - 1
        for k, v in enumerate(slopes):  # t_c - v * m_c <= P_c(k) - v * k
            rows += [r, r]
            cols += [n_cls + c, c]
            data += [1.0, -float(v)]
            upper.append(float(prefix[k]) - float(v) * k)
            r += 1
        rows.append(r)  # t_c <= P_c(G_c): closes the last piece
        cols.append(n_cls + c)
        data.append(1.0)
        upper.append(float(prefix[-1]))
        r += 1
    chords = coo_matrix((data, (rows, cols)), shape=(r, 2 * n_cls)).tocsr()
    weights = np.array([float(w) for w, _, _ in pools] + [0.0] * n_cls).reshape(1, -1)
    cons = [LinearConstraint(chords, -np.inf, np.array(upper)), LinearConstraint(weights, -np.inf, capacity)]
    hi = np.array([len(la) for _, la, _ in pools] + [np.inf] * n_cls, dtype=float)
    obj = np.concatenate([np.zeros(n_cls), -np.ones(n_cls)])
    res = milp(obj, constraints=cons, integrality=np.r_[np.ones(n_cls), np.zeros(n_cls)],
               bounds=Bounds(np.zeros(2 * n_cls), hi))
    if res.x is None:
        raise PowerInferError(f"the placement solver failed: {res.message}")
    take = [int(round(x)) for x in res.x[:n_cls]]
    if sum(t * w for t, (w, _, _) in zip(take, pools)) > capacity:  # HiGHS's integrality tolerance
        raise PowerInferError("the placement solver returned an infeasible point; please report this model")
    return take


# ---- plans ------------------------------------------------------------------------------------------------

@dataclass
class Placement:
    """Hot neurons per layer (ascending int32 indices into the layer's n_ff) and what they cost and bring."""
    hot: list[np.ndarray]
    n_ff: int
    budget: int = 0  # bytes the plan was solved for (split.vram_capacity in the sidecar)
    footprint: Footprint | None = None
    shares: list[float] = field(default_factory=list)  # per layer: activation mass on the device / layer mass
    mass: list[float] = field(default_factory=list)  # per layer: total activation mass

    @property
    def n_hot(self) -> list[int]:
        return [len(h) for h in self.hot]

    @property
    def gpu_share(self) -> float:
        """Expected share of all activations (over layers, weighted by their mass) computed on the device."""
        total = sum(self.mass)
        return sum(s * m for s, m in zip(self.shares, self.mass)) / total if total else 0.0

    @property
    def device_bytes(self) -> int:
        if self.footprint is None:
            raise ValueError("this plan has no footprint (read from a sidecar without its model)")
        return self.footprint.arena_bytes(self.n_hot)

    def mask(self, il: int) -> np.ndarray:
        m = np.zeros(self.n_ff, dtype=np.int32)
        m[self.hot[il]] = 1
        return m


def plan_placement(fp: Footprint, counts: Sequence[np.ndarray], budget: int) -> Placement:
    """The exact best placement of a model with footprint fp for per-layer counts under `budget` bytes."""
    if len(counts) != len(fp.neuron_bytes):
        raise PowerInferError(f"activation statistics for {len(counts)} layers, the model has "
                              f"{len(fp.neuron_bytes)}")
    left = int(budget) - fp.fixed_bytes
    if left < 0:
        raise PowerInferError(f"a VRAM budget of {budget / MIB:.1f} MiB is below the {fp.fixed_bytes / MIB:.1f} MiB "
                              "that must be on the device before any FFN neuron (attention, norms, predictors, "
                              "output head, KV cache, scratch); raise --vram-budget, lower the context, or "
                              "run on the CPU")
    orders, values = zip(*(group_values(c) for c in counts)) if counts else ((), ())
    groups = solve_groups(values, fp.group_costs(), left)
    hot, shares, mass = [], [], []
    for order, c, m in zip(orders, counts, groups):
        idx = np.sort(order[:min(m * GROUP, fp.n_ff)]).astype(np.int32)
        hot.append(idx)
        total = float(np.sum(c, dtype=np.float64))
        mass.append(total)
        shares.append(float(np.sum(np.asarray(c, dtype=np.float64)[idx])) / total if total else 0.0)
    plan = Placement(hot, fp.n_ff, int(budget), fp, shares, mass)
    assert plan.device_bytes <= budget, "placement exceeded its budget"  # by construction; a bug otherwise
    return plan


def check_counts(counts: Sequence[np.ndarray], n_layer: int, n_ff: int, source: str) -> list[np.ndarray]:
    """Validated float64 copies: one non-negative finite vector of n_ff counts per layer."""
    if len(counts) != n_layer:
        raise PowerInferError(f"{source}: statistics for {len(counts)} layers, the model has {n_layer}")
    out = []
    for il, c in enumerate(counts):
        a = np.asarray(c, dtype=np.float64).reshape(-1)
        if a.shape != (n_ff,):
            raise PowerInferError(f"{source}: layer {il} has {a.size} counts, the model's FFN has {n_ff} neurons")
        if not np.all(np.isfinite(a)) or (a < 0).any():
            raise PowerInferError(f"{source}: layer {il} has negative or non-finite counts")
        out.append(a)
    return out


def mib(n_bytes: int) -> float:
    return n_bytes / MIB


def budget_bytes(gib: float) -> int:
    if not math.isfinite(gib) or gib < 0:
        raise PowerInferError(f"--vram-budget must be a non-negative number of GiB, got {gib}")
    return int(gib * GIB)


def default_sidecar(model: str | Path) -> Path:
    """Where PowerInfer looks for a model's placement: <model file>.generated.gpuidx."""
    return Path(str(model) + ".generated.gpuidx")
