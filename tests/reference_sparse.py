"""Tiny PowerInfer (PWRI) test models of every sparse architecture, and an independent numpy forward pass of
docs/FORMATS.md section 2 to check the engine against.

write_tiny_sparse(path, arch, ...) writes a PWRI file (ffn_down_t, per-layer predictors fc1/fc2 of the given
ranks) or, with dense=True, its dense GGUF twin (ffn_down = ffn_down_t transposed, no predictors). `breakage`
edits the tensor list to make malformed files.

SparseReference(path) runs the model one token at a time in float64 (K/V rounded to f16 as the engine's cache
stores them), straight from the formulas: it shares no code with powerinfer_py.models or powerinfer_py.layers.ffn.
Its `predictor_input` argument exists so a test can show that feeding the predictor anything but the residual
docs/FORMATS.md names gives different results.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGUFValueType

from powerinfer_py.gguf import open_gguf, write_gguf
from powerinfer_py.kernels import ref
from powerinfer_py.synth.common import synthetic_vocab
from powerinfer_py.gguf.types import GGMLType, Tensor

SPARSE_ARCHS = ("llama", "bamboo", "falcon", "opt")
TYPES = {"f32": GGMLType.F32, "f16": GGMLType.F16, "q8_0": GGMLType.Q8_0, "q4_0": GGMLType.Q4_0}
N_VOCAB = 512
EMBD_STD = 2.0  # residual rms ~2, so the residual and its normed copy differ clearly (predictor-input test)


def _encode(name: str, x: np.ndarray, ty: GGMLType) -> Tensor:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 1 or ty == GGMLType.F32:
        return Tensor(name, GGMLType.F32, x.shape, x)
    return Tensor(name, ty, x.shape, ref.quantize(x, ty))


def _weights(arch: str, rng, n_layer, E, F, H, Hkv, ranks, dense, norm_2) -> list[tuple[str, np.ndarray]]:
    hd = E // H

    def lin(m, k, gain=1.0):
        return gain * rng.standard_normal((m, k)).astype(np.float32) / np.float32(np.sqrt(k))

    def vec(d, mean=1.0, std=0.3):
        return (mean + std * rng.standard_normal(d)).astype(np.float32)

    biases = arch == "opt"
    out = [("token_embd.weight", EMBD_STD * rng.standard_normal((N_VOCAB, E)).astype(np.float32))]
    if arch == "opt":
        out.append(("position_embd.weight", rng.standard_normal((64, E)).astype(np.float32)))
    for il in range(n_layer):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", vec(E)))
        if arch in ("falcon", "opt"):
            out.append((p + "attn_norm.bias", vec(E, 0.0, 0.2)))
        if norm_2:  # Falcon-40B: the MLP has its own LayerNorm of the layer input
            out += [(p + "attn_norm_2.weight", vec(E)), (p + "attn_norm_2.bias", vec(E, 0.0, 0.2))]
        if arch == "falcon":
            out.append((p + "attn_qkv.weight", lin((H + 2 * Hkv) * hd, E)))
        else:
            for name, rows in (("attn_q", H * hd), ("attn_k", Hkv * hd), ("attn_v", Hkv * hd)):
                out.append((f"{p}{name}.weight", lin(rows, E)))
                if biases:
                    out.append((f"{p}{name}.bias", vec(rows, 0.0, 0.2)))
        out.append((p + "attn_output.weight", lin(E, H * hd)))
        if biases:
            out.append((p + "attn_output.bias", vec(E, 0.0, 0.2)))
        if arch != "falcon":
            out.append((p + "ffn_norm.weight", vec(E)))
            if biases:
                out.append((p + "ffn_norm.bias", vec(E, 0.0, 0.2)))
        if arch in ("llama", "bamboo"):
            out.append((p + "ffn_gate.weight", lin(F, E)))
        out.append((p + "ffn_up.weight", lin(F, E)))
        if biases:
            out.append((p + "ffn_up.bias", vec(F, 0.0, 0.3)))
        down = lin(E, F, gain=2.0)  # [n_embd, n_ff]: a sparse h still moves the residual
        down_name = "ffn_down" if dense else "ffn_down_t"
        out.append((f"{p}{down_name}.weight", down if dense else down.T.copy()))
        if biases:
            out.append((f"{p}{down_name}.bias", vec(E, 0.0, 0.2)))
        fc1, fc2 = lin(ranks[il], E), lin(F, ranks[il])  # drawn for the dense twin too: same weights after
        if not dense:
            out += [(p + "fc1.weight", fc1), (p + "fc2.weight", fc2)]
    out.append(("output_norm.weight", vec(E)))
    if arch in ("falcon", "opt"):
        out.append(("output_norm.bias", vec(E, 0.0, 0.2)))
    else:
        out.append(("output.weight", lin(N_VOCAB, E, gain=2.5)))
    return out


def write_tiny_sparse(path, arch: str, *, dtype: str = "f32", dense: bool = False, n_layer: int = 2,
                      n_embd: int = 64, n_ff: int = 128, n_head: int = 4, n_head_kv: int | None = None,
                      ranks: tuple[int, ...] = (32, 64), threshold: float | None = 0.5,
                      hidden_act: str | None = None, hidden_act_param: float | None = None, seed: int = 0,
                      norm_2: bool = False,
                      breakage: Callable[[list[Tensor]], list[Tensor]] | None = None) -> Path:
    """A tiny `arch` model: PWRI with predictors, or (dense=True) the equivalent GGUF. 2-D weights `dtype`.
    norm_2 (falcon): Falcon-40B's separate attn_norm_2 for the MLP. Dense llama/falcon files say
    powerinfer.hidden_act = "relu" (as our converter writes for ReLU models;
    without it they would be SwiGLU / GELU models) unless hidden_act is given."""
    if dense and hidden_act is None and arch in ("llama", "falcon"):
        hidden_act = "relu"
    Hkv = n_head_kv or {"llama": 2, "bamboo": 2, "falcon": 1, "opt": n_head}[arch]
    rng = np.random.default_rng(seed)
    ranks = tuple(ranks[il % len(ranks)] for il in range(n_layer))
    ln = arch in ("falcon", "opt")
    a = arch
    meta = {"general.architecture": a, "general.name": f"tiny-{a}",
            f"{a}.context_length": 64, f"{a}.embedding_length": n_embd, f"{a}.block_count": n_layer,
            f"{a}.feed_forward_length": n_ff, f"{a}.attention.head_count": n_head,
            f"{a}.attention.head_count_kv": Hkv,
            f"{a}.attention.{'layer_norm_epsilon' if ln else 'layer_norm_rms_epsilon'}": 1e-5}
    if arch != "opt":
        meta[f"{a}.rope.freq_base"] = 10000.0
    if threshold is not None and not dense:
        meta["powerinfer.sparse_threshold"] = float(threshold)
    if hidden_act is not None:
        meta["powerinfer.hidden_act"] = hidden_act
    if hidden_act_param is not None:
        meta["powerinfer.hidden_act_param"] = float(hidden_act_param)
    tokens, scores, types = synthetic_vocab(N_VOCAB)
    meta.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
                 "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1,
                 "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
                 "tokenizer.ggml.add_bos_token": True})
    vtypes = {"tokenizer.ggml.token_type": (GGUFValueType.ARRAY, GGUFValueType.INT32),
              "tokenizer.ggml.scores": (GGUFValueType.ARRAY, GGUFValueType.FLOAT32)}
    ty = TYPES[dtype]
    tensors = [_encode(n, x, ty if n not in ("token_embd.weight", "position_embd.weight") else GGMLType.F32)
               for n, x in _weights(arch, rng, n_layer, n_embd, n_ff, n_head, Hkv, ranks, dense, norm_2)]
    if breakage is not None:
        tensors = breakage(tensors)
    return write_gguf(path, meta, tensors, types=vtypes, magic="GGUF" if dense else "PWRI")


# ---- the reference forward pass ------------------------------------------------------------------------

def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def _ln(x, w, b, eps):
    c = x - x.mean()
    return c / np.sqrt(np.mean(c * c) + eps) * w + b


def _rope(x, pos, base, neox):
    """x [H, D] rotated by position pos over all D dims: pairs (2i, 2i+1), or (i, i + D/2) when neox."""
    d = x.shape[-1]
    theta = pos * base ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(theta), np.sin(theta)
    y = x.copy()
    if neox:
        a, b = x[:, : d // 2], x[:, d // 2:]
        y[:, : d // 2], y[:, d // 2:] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[:, 0::2], x[:, 1::2]
        y[:, 0::2], y[:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return y


class SparseReference:
    """docs/FORMATS.md section 2, one token at a time, in float64.

    threshold: the predictor threshold (None: dense FFN, every neuron). predictor_input: "formats" (the
    residual docs/FORMATS.md names), or the wrong ones "normed" (the FFN input x) and "other" (llama/bamboo/opt:
    the layer input; falcon: the residual after attention)."""

    def __init__(self, path, threshold: float | None, predictor_input: str = "formats"):
        f = open_gguf(path)
        self.arch = f.metadata["general.architecture"]
        a = self.arch
        self.w = {n: ref.dequantize(t).astype(np.float64) for n, t in f.tensors.items()}
        m = f.metadata
        self.sparse = f.is_sparse
        self.n_layer, self.E = m[f"{a}.block_count"], m[f"{a}.embedding_length"]
        self.H, self.Hkv = m[f"{a}.attention.head_count"], m[f"{a}.attention.head_count_kv"]
        self.eps = m.get(f"{a}.attention.layer_norm_rms_epsilon", m.get(f"{a}.attention.layer_norm_epsilon"))
        self.act = m.get("powerinfer.hidden_act", "relu")
        self.act_param = m.get("powerinfer.hidden_act_param", 0.0)
        self.threshold, self.pin = threshold, predictor_input
        f.close()
        self.k = [[] for _ in range(self.n_layer)]
        self.v = [[] for _ in range(self.n_layer)]
        self.active = np.zeros(self.n_layer, dtype=np.int64)  # active neurons summed over tokens
        self.n_tokens = 0

    def _gate_act(self, g):
        if self.act == "fatrelu":
            return np.where(g > self.act_param, g, 0.0)
        return np.maximum(g, 0.0)

    def _ffn(self, il: int, x: np.ndarray, p: np.ndarray) -> np.ndarray:
        """x: the FFN input, p: the predictor input, both [E]."""
        w, b = self.w, f"blk.{il}."
        down_t = w[b + "ffn_down_t.weight"] if self.sparse else w[b + "ffn_down.weight"].T
        n_ff = down_t.shape[0]
        if self.threshold is None:
            act = np.arange(n_ff)
        else:
            logits = w[b + "fc2.weight"] @ np.maximum(w[b + "fc1.weight"] @ p, 0.0)
            act = np.flatnonzero(logits >= self.threshold)
        self.active[il] += len(act)
        up = w[b + "ffn_up.weight"][act] @ x
        if self.arch in ("llama", "bamboo"):
            g = self._gate_act(w[b + "ffn_gate.weight"][act] @ x)
            h = g * (np.maximum(up, 0.0) if self.arch == "bamboo" else up)
        else:
            bias = w.get(b + "ffn_up.bias")
            h = np.maximum(up + (bias[act] if bias is not None else 0.0), 0.0)
        y = h @ down_t[act]
        bias = w.get(b + ("ffn_down_t.bias" if self.sparse else "ffn_down.bias"))
        return y + bias if bias is not None else y

    def _attend(self, il, q, k, v):
        """q [H, hd]; k, v [Hkv, hd] appended to the cache (rounded to f16); returns [H * hd]."""
        self.k[il].append(k.astype(np.float16).astype(np.float64))
        self.v[il].append(v.astype(np.float16).astype(np.float64))
        K, V = np.stack(self.k[il], 1), np.stack(self.v[il], 1)  # [Hkv, T, hd]
        hd, group = q.shape[1], self.H // self.Hkv
        out = np.empty_like(q)
        for h in range(self.H):
            s = K[h // group] @ q[h] / np.sqrt(hd)
            e = np.exp(s - s.max())
            out[h] = (e / e.sum()) @ V[h // group]
        return out.reshape(-1)

    def step(self, token: int) -> np.ndarray:
        """Feed one token; logits f64 [n_vocab]."""
        w, pos, eps, hd = self.w, self.n_tokens, self.eps, self.E // self.H
        x = w["token_embd.weight"][token].copy()
        if self.arch == "opt":
            x += w["position_embd.weight"][pos]
        for il in range(self.n_layer):
            b = f"blk.{il}."
            if self.arch == "falcon":
                n = _ln(x, w[b + "attn_norm.weight"], w[b + "attn_norm.bias"], eps)
                qkv = w[b + "attn_qkv.weight"] @ n
                q = _rope(qkv[: self.H * hd].reshape(self.H, hd), pos, 10000.0, True)
                k = _rope(qkv[self.H * hd:(self.H + self.Hkv) * hd].reshape(self.Hkv, hd), pos, 10000.0, True)
                v = qkv[(self.H + self.Hkv) * hd:].reshape(self.Hkv, hd)
                o = w[b + "attn_output.weight"] @ self._attend(il, q, k, v)
                m = n
                if b + "attn_norm_2.weight" in w:
                    m = _ln(x, w[b + "attn_norm_2.weight"], w[b + "attn_norm_2.bias"], eps)
                p = {"formats": x, "normed": m, "other": x + o}[self.pin]
                x = x + o + self._ffn(il, m, p)
                continue
            layer_in = x
            if self.arch == "opt":
                n = _ln(x, w[b + "attn_norm.weight"], w[b + "attn_norm.bias"], eps)
                q, k, v = (w[f"{b}attn_{c}.weight"] @ n + w[f"{b}attn_{c}.bias"] for c in "qkv")
                a = self._attend(il, q.reshape(self.H, hd), k.reshape(self.Hkv, hd), v.reshape(self.Hkv, hd))
                x = x + w[b + "attn_output.weight"] @ a + w[b + "attn_output.bias"]
                m = _ln(x, w[b + "ffn_norm.weight"], w[b + "ffn_norm.bias"], eps)
            else:
                n = _rms(x, w[b + "attn_norm.weight"], eps)
                q = _rope((w[b + "attn_q.weight"] @ n).reshape(self.H, hd), pos, 10000.0, False)
                k = _rope((w[b + "attn_k.weight"] @ n).reshape(self.Hkv, hd), pos, 10000.0, False)
                v = (w[b + "attn_v.weight"] @ n).reshape(self.Hkv, hd)
                x = x + w[b + "attn_output.weight"] @ self._attend(il, q, k, v)
                m = _rms(x, w[b + "ffn_norm.weight"], eps)
            p = {"formats": x, "normed": m, "other": layer_in}[self.pin]
            x = x + self._ffn(il, m, p)
        self.n_tokens += 1
        if self.arch in ("falcon", "opt"):
            x = _ln(x, w["output_norm.weight"], w["output_norm.bias"], eps)
        else:
            x = _rms(x, w["output_norm.weight"], eps)
        return w.get("output.weight", w["token_embd.weight"]) @ x
