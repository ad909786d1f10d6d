"""Mixture-of-experts FFN (qwen3moe, qwen2moe, granitemoe, Mixtral-style llama files): routing and the chosen experts.

Per token x (the normed FFN input, f32 [n_embd]), as llama.cpp computes it:
    probs   = softmax(router · x)                               router = ffn_gate_inp, f32 (n_expert, n_embd)
    chosen  = the n_used experts with the largest probs, largest first
    w       = probs[chosen], divided by their sum when the model renormalizes (llama, qwen3moe, granitemoe; not
              qwen2moe)
    y       = sum over r in chosen order of  w_r * down_e · (silu(gate_e · x) * (up_e · x)),  e = chosen[r]
    qwen2moe adds its shared expert:  y += sigmoid(gate_inp_shexp · x) * shared_ffn(x)
    granitemoe's (when the file has one) has no gate:  y += shared_ffn(x)
ernie4_5-moe's selection bias (select_bias, f32 [n_expert], its blk.N.exp_probs_b.bias; off for the others):
    chosen  = the n_used experts with the largest probs + select_bias;  w = probs[chosen] (unbiased), renormalized
gpt-oss (options of MoEFFN, off for the others, whose bits they leave alone):
    logits  = router · x + router_bias;  chosen = the n_used largest logits;  w = softmax(logits[chosen])
              (weights_after_topk: the softmax runs over the chosen logits only, after the selection)
    y       = sum over r of  w_r * (down_e · h + b_down_e),  h = act(gate_e · x + b_gate_e, up_e · x + b_up_e)
    with act = swiglu_oai (below) and b_* the per-expert biases (expert_biases, f32 (n_expert, width)).
deepseek2 (options of MoEFFN, off for the others):
    probs   = sigmoid(router · x) with gating "sigmoid" (DeepSeek-V3), the softmax above otherwise
    groups  (n_groups > 1): the experts split into n_groups runs of n_expert / n_groups; a group scores the sum
              of its two largest probs + select_bias; experts outside the n_group_used best groups are not chosen
    w       = probs[chosen] (renormalized with a sum clamped at 6.1e-5, as llama.cpp), times weights_scale
The experts' weights are 3-D tensors (n_expert, rows, cols); expert e is the slice [e], a zero-copy 2-D view.

Decode (one token) makes four kernel calls after the router: the chosen experts' gate rows and up rows are
each one row gather over the 2-D view (n_expert * n_ff_exp, n_embd) of their tensor (runs of consecutive rows,
which the gather reads as one stream), and the down projections one grouped call (kernels.matmul_experts: every
expert with its own input, one pool job). A batch (prefill) groups the (token, expert) pairs by expert and
makes one grouped call each for gate, up and down, each expert's weights read once for all its tokens, then adds
every token's experts in its own chosen order, so a token gets the same bits in a batch as alone.

smallthinker (options of MoEFFN, off for the others): the experts are ReLU-gated, act = "reglu":
    y       = sum over r of  w_r * down_e · (relu(gate_e · x) * (up_e · x))
and the router reads another input than the experts (the layer's input before attention): __call__ takes its
logits precomputed (router_logits), the probabilities, choice and weights then as above.

gemma4 (options of MoEFFN, off for the others): GeGLU experts, act = "geglu": h = gelu(gate_e · x) * (up_e · x);
their gate and up may come as one merged tensor (gate_up: (n_expert, 2 n_ff, n_embd), expert e's gate rows first,
then its up rows), which the decode path reads as one row gather and a batch as one grouped call; and per-expert
output scales (expert_scales f32 [n_expert]): expert e's output is multiplied by expert_scales[e] (folded into its
router weight). Its router also reads its own input (router_logits, as smallthinker).

nemotron_h_moe (options of MoEFFN, off for the others): ungated squared-ReLU experts, act = "relu2", gate None:
    y       = sum over r of  w_r * down_e · relu(up_e · x)^2
the up rows take the gate rows' place (one gather / grouped call, no second one). `exact` is refused: the up
rows are the only input projection and must all be computed to know which neurons fire, and the down matrix's
quantization blocks run along n_ff (above), so skipping the zero neurons would read the same bytes.

llama4 (weight_input, off for the others): probs = sigmoid(router · x), chosen = the n_used largest logits, and
the weight scales the expert's input rather than its output:  y = sum_r down_e · (silu(gate_e · w_r x) * (up_e · w_r x)),
computed as w_r (gate_e · x) and w_r (up_e · x) (the projections are linear), the output then added unweighted.

Experts are where a MoE model is sparse: the other experts' weights are never read. Within a chosen ReLU expert
most neurons are exactly 0 as well, which `exact` mode (exact=True, ReLU experts only; ffn.resolve_sparse refuses
the other modes and SwiGLU experts) uses: the gate rows of the chosen experts are computed densely, then only the
up rows of neurons with relu(gate) != 0 (one row gather over the expert's rows; per expert, the union over its
tokens in a batch), and the down projection takes h with exact zeros elsewhere. Bit for bit `off`: a gathered row
has the bits of the full matmul's row, and relu(g) * u is 0 wherever relu(g) is. It saves the inactive neurons'
up rows only: a GGUF expert's down matrix (n_embd, n_ff) is stored in quantization blocks along n_ff, so skipping
some of its columns would read the same blocks. `stats` (an ffn.SparsityStats with n_ff = the expert width,
counting n_used slots per token) records the non-zero neurons of the chosen experts, in both modes.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFileError, UnsupportedError
from ..gguf.types import Tensor


def require_dense_ffn(config, what: str) -> None:
    """Refuse the activation tools (profile, calibrate, train-predictor) on a mixture-of-experts model, before
    any work: they observe one set of FFN neurons per layer, which expert layers do not have."""
    if config.n_expert:
        raise UnsupportedError(f"{what} works on dense FFNs; this {config.arch} model is a mixture of experts "
                               f"({config.n_expert} experts per layer)")


def usage_note(config, ffns) -> str:
    """One line on how a run spread its tokens over the experts (for `run -v` and `info -v`)."""
    ffns = [getattr(f, "experts", f) for f in ffns]  # nemotron_h_moe wraps its MoEFFN (layers/nemotron_moe.py)
    counts = [f.counts for f in ffns if isinstance(f, MoEFFN)]
    busiest = float(np.mean([c.max() / max(1, c.sum()) for c in counts])) if counts else 0.0
    note = (f"a mixture of experts: each token runs {config.n_expert_used} of {config.n_expert} experts per layer; "
            f"the busiest expert of a layer took {100 * busiest:.0f}% of its routings")
    stats = next((f.stats for f in ffns if isinstance(f, MoEFFN) and f.stats is not None), None)
    if stats is not None and stats.tokens.any():  # ReLU experts (smallthinker): their neurons that fired
        note += (f"; active neurons of the chosen experts: {100 * stats.mean_fraction:.1f}% of {stats.n_ff}"
                 + (" (up rows read for those only: --sparse exact)" if stats.mode == "exact" else ""))
    return note


SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # gpt-oss's constants (llama.cpp's build_moe_ffn has the same)


def swiglu_oai(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """gpt-oss's gated activation, f32: g' = min(g, 7), u' = clip(u, -7, 7), g' * sigmoid(1.702 g') * (u' + 1)."""
    g = np.minimum(g, np.float32(SWIGLU_OAI_LIMIT))
    u = np.clip(u, np.float32(-SWIGLU_OAI_LIMIT), np.float32(SWIGLU_OAI_LIMIT))
    glu = g / (np.float32(1.0) + np.exp(np.float32(-SWIGLU_OAI_ALPHA) * g))
    return (glu * (u + np.float32(1.0))).astype(np.float32, copy=False)


def expert_rows(t: Tensor) -> Tensor:
    """A 3-D expert tensor (n_expert, rows, cols) as one 2-D tensor (n_expert * rows, cols), same bytes."""
    n_expert, rows, cols = t.shape
    return Tensor(t.name, t.type, (n_expert * rows, cols), t.data.reshape(n_expert * rows, -1))


def expert(t: Tensor, e: int) -> Tensor:
    """Expert e of a 3-D expert tensor as a 2-D tensor (rows, cols), same bytes."""
    return Tensor(f"{t.name}[{e}]", t.type, t.shape[1:], t.data[e])


class MoEFFN:
    """One layer's mixture-of-experts FFN: moe(x, p=None) -> y f32 [N, n_embd] for x f32 [N, n_embd] (p, the
    predictor input of dense FFNs, is ignored). shared: an ffn.FFN (qwen2moe's shared expert) with its gate
    vector shared_gate f32 [n_embd] (None: added ungated, granitemoe), or None. gpt-oss's options (module
    docstring): router_bias f32 [n_expert], weights_after_topk, expert_biases (gate, up, down) f32
    (n_expert, n_ff), (n_expert, n_ff), (n_expert, n_embd), act "swiglu" or "swiglu_oai". gemma4's (module
    docstring): act "geglu", gate_up (gate and up None), expert_scales f32 [n_expert]."""

    split = None  # hybrid CPU/GPU splits are for PWRI files, which have no experts
    BATCH_SLICE = 256  # prefill tokens per pass: their (token, expert) rows are gathered and held at once

    def __init__(self, kernels, router: Tensor, gate: Tensor, up: Tensor, down: Tensor, n_used: int,
                 norm_weights: bool, *, layer: int = 0, shared=None, shared_gate: np.ndarray | None = None,
                 router_bias: np.ndarray | None = None, weights_after_topk: bool = False,
                 expert_biases: tuple | None = None, act: str = "swiglu", select_bias: np.ndarray | None = None,
                 gating: str = "softmax", weights_scale: float = 1.0, n_groups: int = 0, n_group_used: int = 0,
                 exact: bool = False, stats=None, gate_up: Tensor | None = None,
                 expert_scales: np.ndarray | None = None, weight_input: bool = False):
        self.k, self.layer, self.n_used, self.norm_weights = kernels, layer, n_used, norm_weights
        self.gate_up = gate_up  # gemma4's merged gate and up (gate, up are then None)
        self.ungated = False
        if gate_up is not None:
            self.n_expert, n_ff2, n_embd = gate_up.shape
            self.n_ff = n_ff2 // 2
            gate_shape = up_shape = (self.n_expert, self.n_ff, n_embd)
            if n_ff2 % 2:
                raise ModelFileError(f"layer {layer}: merged expert gate/up tensor has shape {gate_up.shape}: "
                                     f"an odd number of rows per expert")
        else:
            self.ungated = gate is None  # nemotron_h_moe: relu(up x)^2, the up rows stand in for the gate rows
            gate = up if gate is None else gate
            gate_shape, up_shape = gate.shape, up.shape
            self.n_expert, self.n_ff, n_embd = gate_shape
        if up_shape != gate_shape or down.shape != (self.n_expert, n_embd, self.n_ff):
            raise ModelFileError(f"layer {layer}: expert tensors disagree: gate {gate_shape}, up {up_shape}, "
                                 f"down {down.shape} (expected (n_expert, n_embd, n_ff) = "
                                 f"{(self.n_expert, n_embd, self.n_ff)})")
        if router is not None and router.shape != (self.n_expert, n_embd):  # None: logits always given
            raise ModelFileError(f"layer {layer}: router ffn_gate_inp has shape {router.shape}, expected "
                                 f"{(self.n_expert, n_embd)}")
        self.router, self.gate, self.up, self.down = router, gate, up, down
        if gate_up is None:
            self.gate_rows, self.up_rows = expert_rows(gate), expert_rows(up)
            self._ff = np.arange(self.n_ff, dtype=np.int32)  # one expert's rows, offset per chosen expert
        else:
            self.gate = self.up = None
            self.gate_up_rows = expert_rows(gate_up)
            self._ff = np.arange(2 * self.n_ff, dtype=np.int32)  # one expert's gate and up rows
        if expert_scales is not None and expert_scales.shape != (self.n_expert,):
            raise ModelFileError(f"layer {layer}: per-expert output scales have shape {expert_scales.shape}, "
                                 f"expected {(self.n_expert,)}")
        self.expert_scales = expert_scales
        if weight_input and (gate_up is not None or exact or expert_biases is not None or self.ungated):
            raise ValueError("MoEFFN: weight_input takes separate gate and up tensors, no biases, no exact mode")
        self.weight_input = weight_input  # llama4: the router weight scales the expert's input (module docstring)
        self.shared, self.shared_gate = shared, shared_gate
        self.counts = np.zeros(self.n_expert, dtype=np.int64)  # tokens routed to each expert so far
        self.router_bias, self.weights_after_topk = router_bias, weights_after_topk
        if select_bias is not None and select_bias.shape != (self.n_expert,):
            raise ModelFileError(f"layer {layer}: expert selection bias has shape {select_bias.shape}, expected "
                                 f"{(self.n_expert,)}")
        self.select_bias = select_bias
        if gating not in ("softmax", "sigmoid"):
            raise ValueError(f"MoEFFN: unknown gating {gating!r}")
        if n_groups > 1 and (self.n_expert % n_groups or not 0 < n_group_used <= n_groups):
            raise ModelFileError(f"layer {layer}: {self.n_expert} experts cannot form {n_groups} groups of which "
                                 f"{n_group_used} are used")
        self.gating, self.weights_scale = gating, weights_scale
        self.n_groups, self.n_group_used = (n_groups, n_group_used) if n_groups > 1 else (0, 0)
        if act not in ("swiglu", "swiglu_oai", "reglu", "geglu", "relu2") or (act == "relu2") != self.ungated:
            raise ValueError(f"MoEFFN: unknown activation {act!r}")
        if gate_up is not None and (exact or expert_biases is not None):
            raise ValueError("MoEFFN: a merged gate_up tensor takes no exact mode and no expert biases")
        if exact and (act != "reglu" or expert_biases is not None):
            raise UnsupportedError(f"layer {layer}: sparse mode 'exact' needs ReLU-gated experts, these are {act}")
        self.relu = act == "reglu"
        self.act = (kernels.geglu if act == "geglu" else
                    {"swiglu": kernels.swiglu, "swiglu_oai": swiglu_oai, "reglu": reglu, "relu2": relu2}[act])
        self.exact, self.stats = exact, stats
        self.b_gate = self.b_up = self.b_down = None
        if expert_biases is not None:
            self.b_gate, self.b_up, self.b_down = expert_biases
            want = ((self.n_expert, self.n_ff), (self.n_expert, self.n_ff), (self.n_expert, n_embd))
            if any(b.shape != w for b, w in zip(expert_biases, want)):
                raise ModelFileError(f"layer {layer}: expert biases have shapes {[b.shape for b in expert_biases]}, "
                                     f"expected {list(want)}")

    @property
    def observer(self):
        return None

    @observer.setter
    def observer(self, fn) -> None:
        """The activation tools (profile, calibrate, train-predictor) hook ffn.FFN's dense path; an expert layer
        has no single set of neurons to observe, so asking is an error rather than an empty result."""
        if fn is not None:
            raise UnsupportedError(f"layer {self.layer} is a mixture of experts: profiling, threshold calibration "
                                   "and predictor training work on dense FFNs only")

    def route(self, x: np.ndarray, logits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(chosen int [N, n_used] largest probability first, weights f32 [N, n_used]) for x f32 [N, n_embd], or
        from the router logits f32 [N, n_expert] when given (smallthinker: its router reads another input)."""
        logits = self.k.matmul(self.router, x) if logits is None else np.array(logits, dtype=np.float32)
        if self.router_bias is not None:
            logits += self.router_bias
        if self.weights_after_topk:  # gpt-oss: pick by logit, then softmax the chosen ones
            chosen = np.argsort(-logits, axis=1, kind="stable")[:, :self.n_used]
            w = np.take_along_axis(logits, chosen, axis=1)
            w = np.exp(w - w.max(axis=1, keepdims=True), dtype=np.float32)
            w /= w.sum(axis=1, keepdims=True, dtype=np.float32)
            self.counts += np.bincount(chosen.reshape(-1), minlength=self.n_expert)
            return chosen, w
        if self.gating == "sigmoid":  # deepseek2 (V3): independent scores per expert
            probs = (np.float32(1.0) / (np.float32(1.0) + np.exp(-logits, dtype=np.float32))).astype(np.float32)
        else:
            logits -= logits.max(axis=1, keepdims=True)
            probs = np.exp(logits, dtype=np.float32)
            probs /= probs.sum(axis=1, keepdims=True, dtype=np.float32)
        score = probs if self.select_bias is None else probs + self.select_bias  # ernie4_5-moe, V3 pick by biased probs
        if self.weight_input:  # llama4 picks by logit (the same order as sigmoid's, without its ties near 1)
            score = logits
        if self.n_groups:
            score = self._mask_groups(score)
        chosen = np.argsort(-score, axis=1, kind="stable")[:, :self.n_used]
        w = np.take_along_axis(probs, chosen, axis=1)
        if self.norm_weights:
            w = w / np.maximum(w.sum(axis=1, keepdims=True, dtype=np.float32), np.float32(6.103515625e-5))
        if self.weights_scale != 1.0:
            w = w * np.float32(self.weights_scale)
        self.counts += np.bincount(chosen.reshape(-1), minlength=self.n_expert)
        return chosen, w.astype(np.float32, copy=False)

    def _mask_groups(self, score: np.ndarray) -> np.ndarray:
        """score f32 [N, n_expert] with the experts outside each token's n_group_used best groups set to -inf; a
        group's score is the sum of its two largest expert scores (DeepSeek-V3's group-limited routing)."""
        n = score.shape[0]
        g = score.reshape(n, self.n_groups, -1)
        top2 = np.sort(g, axis=2)[:, :, -2:].sum(axis=2, dtype=np.float32)
        keep = np.argsort(-top2, axis=1, kind="stable")[:, :self.n_group_used]
        out = np.full_like(g, -np.inf)
        np.put_along_axis(out, keep[:, :, None], np.take_along_axis(g, keep[:, :, None], axis=1), axis=1)
        return out.reshape(n, -1)

    def __call__(self, x: np.ndarray, p: np.ndarray | None = None,
                 router_logits: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        chosen, w = self.route(x, router_logits)
        if self.expert_scales is not None:  # gemma4: expert e's output times expert_scales[e]
            w = w * self.expert_scales[chosen]
        w_in = None
        if self.weight_input:  # llama4: the weights scale the experts' inputs; outputs are added as they are
            w_in, w = w, np.ones_like(w)
        out = (self._decode(x[0], chosen[0], w[0], None if w_in is None else w_in[0])[None, :] if x.shape[0] == 1
               else self._batch(x, chosen, w, w_in))
        if self.shared is not None and self.shared_gate is None:  # granitemoe: added as it is
            out += self.shared(x)
        elif self.shared is not None:
            g = x @ self.shared_gate
            out += (1.0 / (1.0 + np.exp(-g, dtype=np.float32)))[:, None] * self.shared(x)
        return out

    def _decode(self, x: np.ndarray, chosen: np.ndarray, w: np.ndarray, w_in: np.ndarray | None = None) -> np.ndarray:
        k, F = self.k, self.n_ff
        order = np.argsort(chosen, kind="stable")  # the row gathers take ascending rows
        if self.gate_up is not None:  # one gather of each chosen expert's gate rows and up rows
            rows = (chosen[order, None].astype(np.int32) * np.int32(2 * F) + self._ff).reshape(-1)
            gu = k.matmul_rows(self.gate_up_rows, rows, x).reshape(len(chosen), 2, F)
            h = self.act(np.ascontiguousarray(gu[:, 0]).reshape(-1), np.ascontiguousarray(gu[:, 1]).reshape(-1))
            return self._down_decode(h.reshape(len(chosen), F), chosen, order, w)
        rows = (chosen[order, None].astype(np.int32) * np.int32(F) + self._ff).reshape(-1)
        g = k.matmul_rows(self.gate_rows, rows, x)
        if self.exact:  # up rows only where relu(gate) != 0; h is exactly 0 elsewhere
            a = np.maximum(g, np.float32(0))
            live = k.select_nonzero(a)
            h = np.zeros_like(a)
            h[live] = a[live] * k.matmul_rows(self.up_rows, rows[live], x)
            h = h.reshape(len(chosen), F)
            self._count(1, len(live), h)
        else:
            u = None if self.ungated else k.matmul_rows(self.up_rows, rows, x)
            if w_in is not None:  # llama4: w_r (gate_e · x), w_r (up_e · x) (module docstring)
                scale = np.repeat(w_in[order], self.n_ff)
                g *= scale
                u *= scale
            if self.b_gate is not None:
                g += self.b_gate[chosen[order]].reshape(-1)
                u += self.b_up[chosen[order]].reshape(-1)
            if self.stats is not None:
                n_live = int(np.count_nonzero(g > 0))
            h = self.act(g, u).reshape(len(chosen), F)  # row i: expert chosen[order[i]]
            if self.stats is not None:
                self._count(1, n_live, h)
        return self._down_decode(h, chosen, order, w)

    def _down_decode(self, h: np.ndarray, chosen: np.ndarray, order: np.ndarray, w: np.ndarray) -> np.ndarray:
        """One token's output from h f32 [n_used, n_ff] (row i: expert chosen[order[i]]): the down projections in
        one grouped call, weighted and summed in chosen order."""
        k = self.k
        o = k.matmul_experts(self.down, chosen[order], np.arange(len(chosen) + 1), h)
        if self.b_down is not None:
            o += self.b_down[chosen[order]]
        slot = np.empty_like(order)
        slot[order] = np.arange(len(order))
        ow = o[slot] * w[:, None]  # row r: the r-th chosen expert's weighted output
        y = ow[0]
        for r in range(1, len(chosen)):  # chosen order (largest weight first), as llama.cpp sums them
            y += ow[r]
        return y

    def _batch(self, x: np.ndarray, chosen: np.ndarray, w: np.ndarray, w_in: np.ndarray | None = None) -> np.ndarray:
        """Tokens in slices of BATCH_SLICE (a slice's inputs and outputs are held once per chosen expert:
        n_used x slice x n_embd floats each)."""
        if len(x) <= self.BATCH_SLICE:
            return self._slice(x, chosen, w, w_in)
        y = np.empty_like(x)
        for t0 in range(0, len(x), self.BATCH_SLICE):
            t1 = t0 + self.BATCH_SLICE
            y[t0:t1] = self._slice(x[t0:t1], chosen[t0:t1], w[t0:t1], None if w_in is None else w_in[t0:t1])
        return y

    def _slice(self, x: np.ndarray, chosen: np.ndarray, w: np.ndarray, w_in: np.ndarray | None = None) -> np.ndarray:
        k = self.k
        n_tok, n_used = chosen.shape
        # the (token, slot) pairs grouped by expert: one grouped call each for gate, up and down
        order = np.argsort(chosen.reshape(-1), kind="stable")
        tok, slot = np.divmod(order, n_used)
        experts, counts = np.unique(chosen.reshape(-1)[order], return_counts=True)
        tok_off = np.concatenate([[0], np.cumsum(counts)])
        xs = np.ascontiguousarray(x[tok])
        if self.gate_up is not None:  # one grouped call for gate and up: each row [gate | up]
            gu = k.matmul_experts(self.gate_up, experts, tok_off, xs)
            F = self.n_ff
            h = self.act(np.ascontiguousarray(gu[:, :F]), np.ascontiguousarray(gu[:, F:]))
            o = k.matmul_experts(self.down, experts, tok_off, h)
            return self._combine(x, o, tok, slot, w, n_used)
        g = k.matmul_experts(self.gate, experts, tok_off, xs)
        if self.exact:
            h = self._exact_up(xs, g, experts, tok_off)
        else:
            u = None if self.ungated else k.matmul_experts(self.up, experts, tok_off, xs)
            if w_in is not None:  # llama4: each (token, expert) row times its router weight
                scale = w_in[tok, slot][:, None]
                g *= scale
                u *= scale
            if self.b_gate is not None:
                row_expert = chosen.reshape(-1)[order]
                g += self.b_gate[row_expert]
                u += self.b_up[row_expert]
            n_live = int(np.count_nonzero(g > 0)) if self.stats is not None else 0
            h = self.act(g, u)
            if self.stats is not None:
                self._count(n_tok, n_live, h)
        o = k.matmul_experts(self.down, experts, tok_off, h)
        if self.b_down is not None:
            o += self.b_down[row_expert]
        return self._combine(x, o, tok, slot, w, n_used)

    @staticmethod
    def _combine(x, o, tok, slot, w, n_used) -> np.ndarray:
        """y [n_tok, n_embd] from the grouped rows o (row j: token tok[j]'s expert in rank slot[j]), weighted and
        added in each token's chosen order."""
        n_tok = len(x)
        o *= w[tok, slot][:, None]
        # every token once per rank: rank 0's outputs, then rank 1's added, ... (each token's chosen order)
        by_rank = np.argsort(slot, kind="stable").reshape(n_used, n_tok)
        y = np.empty_like(x)
        y[tok[by_rank[0]]] = o[by_rank[0]]
        for r in range(1, n_used):
            y[tok[by_rank[r]]] += o[by_rank[r]]
        return y

    def _exact_up(self, xs: np.ndarray, g: np.ndarray, experts: np.ndarray, tok_off: np.ndarray) -> np.ndarray:
        """h f32 [T, n_ff] of the grouped (token, expert) rows xs from their gate values g (exact mode): per expert,
        the up rows of the neurons some of its tokens activate (the union), one row gather each."""
        a = np.maximum(g, np.float32(0))
        h = np.zeros_like(a)
        F = self.n_ff
        for i, e in enumerate(experts):
            t0, t1 = int(tok_off[i]), int(tok_off[i + 1])
            live = np.flatnonzero((a[t0:t1] != 0).any(axis=0)).astype(np.int32)
            if len(live):
                u = self.k.matmul_rows(self.up_rows, live + np.int32(int(e) * F), np.ascontiguousarray(xs[t0:t1]))
                h[t0:t1, live] = a[t0:t1][:, live] * u
        self._count(len(xs) // self.n_used, int(np.count_nonzero(a)), h)
        return h

    def _count(self, n_tok: int, n_live: int, h: np.ndarray) -> None:
        """Record n_tok tokens' neurons with relu(gate) != 0 (n_live) and non-zero h in self.stats, if any."""
        if self.stats is not None:
            self.stats.record(self.layer, n_tok * self.n_used, n_live, int(np.count_nonzero(h)))


def reglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """smallthinker's expert activation, f32: relu(g) * u (llama.cpp's reglu)."""
    return (np.maximum(g, np.float32(0)) * u).astype(np.float32, copy=False)


def relu2(g: np.ndarray, u: None = None) -> np.ndarray:
    """nemotron_h_moe's ungated expert activation, f32: relu(g)^2 (g: the up projection; llama.cpp's relu then sqr)."""
    a = np.maximum(g, np.float32(0))
    return (a * a).astype(np.float32, copy=False)
