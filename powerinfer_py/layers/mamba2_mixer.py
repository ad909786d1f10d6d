"""The Mamba-2 mixer (state-space duality layer) as llama.cpp runs it, shared by the Mamba-2 hybrids.

Sizes: d_inner = H heads x P (head width), G groups of B and C (head h reads group h // (H / G)), state width N,
conv kernel K, conv_dim = d_inner + 2 G N. Per layer, on the normed input h_t of each token:

    z | xBC | dt = W_in · h_t                          (ssm_in: d_inner | conv_dim | H rows)
    xBC = silu(sum_{j<K} w[:, j] * xBC_{t-K+1+j} + b)  (depthwise causal conv, ssm_conv1d weight [conv_dim, K]
                                                        and bias, optional in the file; inputs before position
                                                        0 are zero; w[:, K-1] weighs the current token)
    x | B | C = xBC                                    (x [H, P], B and C [G, N])
    dt_h = softplus(dt_h + dt_bias_h)                  (softplus(v) = v above 20, as ggml)
    per head h, with g = h // (H / G):
        S_h = exp(dt_h A_h) S_h + dt_h x_h B_g^T       (S_h [P, N]; A = ssm_a, stored already as -exp(A_log))
        y_h = S_h C_g + D_h x_h                        (D = ssm_d, the skip)
    y = y * silu(z)                                    (the gate first ...)
    y = rmsnorm over each of the G groups of d_inner / G values, times ssm_norm   (... then the norm; falcon-h1
                                                                                 files may leave it out)
    out = W_out · y                                    (ssm_out)

The recurrence runs token by token, each token one C call on the CPU kernels (csrc/ssm_scan.c), a prefill's
as a decode step's (the scan is cheap next to the projections, which go through the kernels' matmul, so
quantized files work); kernels without that call run it in numpy. The conv and SSM states live in the cache
(mamba2_cache.Mamba2KVCache) and continue across forward calls.

Mamba2Mixer is a mixin for a Model subclass (it uses self.config and self.kernels); its small steps (_conv,
_scan, _gate_norm) are methods so tests can swap one for a wrong variant and measure how far off it is.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping

import numpy as np

from ..gguf.types import Tensor
from ..kernels.ref import dequantize
from .weights import Expected, get_tensor, norm_weight

SOFTPLUS_LINEAR = 20.0  # above this softplus(v) is v (ggml's cut-off)


def mamba2_dims(c) -> tuple[int, int, int, int, int]:
    """(H heads, P head width, G groups, N state width, conv_dim) of config c."""
    H, G, N = c.ssm_n_v_heads, c.ssm_n_group, c.ssm_d_state
    return H, c.ssm_d_inner // H, G, N, c.ssm_d_inner + 2 * G * N


def mamba2_expected(c, p: str, norm_required: bool = True) -> Expected:
    """One mixer layer's tensors (prefix p = "blk.N."): name -> (numpy shape, required); the grouped norm
    ssm_norm is optional where norm_required is False (falcon-h1: llama.cpp skips the norm without it)."""
    H, _, G, N, conv_dim = mamba2_dims(c)
    d = c.ssm_d_inner
    return {p + "ssm_in.weight": ((2 * d + 2 * G * N + H, c.n_embd), True),
            p + "ssm_conv1d.weight": ((conv_dim, c.conv_kernel), True), p + "ssm_conv1d.bias": ((conv_dim,), False),
            p + "ssm_dt.bias": ((H,), True), p + "ssm_a": ((H, 1), True), p + "ssm_d": ((H, 1), True),
            p + "ssm_norm.weight": ((G, d // G), norm_required), p + "ssm_out.weight": ((c.n_embd, d), True)}


def mamba2_tensors(c, tensors: Mapping[str, Tensor], il: int, norm_required: bool = True) -> SimpleNamespace:
    """Layer il's mixer tensors: the projections as Tensors (matmul), the rest as f32 arrays (norm None when the
    optional ssm_norm is absent)."""
    p = f"blk.{il}."
    _, _, _, _, conv_dim = mamba2_dims(c)
    conv = get_tensor(tensors, p + "ssm_conv1d.weight")
    return SimpleNamespace(
        ssm_in=get_tensor(tensors, p + "ssm_in.weight"), ssm_out=get_tensor(tensors, p + "ssm_out.weight"),
        conv_w=np.ascontiguousarray(dequantize(conv).reshape(conv_dim, c.conv_kernel), dtype=np.float32),
        conv_b=norm_weight(get_tensor(tensors, p + "ssm_conv1d.bias", required=False)),
        dt_b=norm_weight(get_tensor(tensors, p + "ssm_dt.bias")),
        A=norm_weight(get_tensor(tensors, p + "ssm_a")), D=norm_weight(get_tensor(tensors, p + "ssm_d")),
        norm=norm_weight(get_tensor(tensors, p + "ssm_norm.weight", required=norm_required)))


def softplus(v: np.ndarray) -> np.ndarray:
    return np.where(v > SOFTPLUS_LINEAR, v, np.log1p(np.exp(np.minimum(v, SOFTPLUS_LINEAR)))).astype(np.float32)


class Mamba2Mixer:
    """The mixer (module docstring) as methods of a Model: _mamba2(il, L, h, cache, p0) -> its output [N, n_embd]."""

    def _attend(self, il: int, L, h: np.ndarray, pos: np.ndarray, cache, p0: int) -> np.ndarray:
        """A hybrid's attention layer (granitehybrid, falcon-h1) on its normed input h [N, n_embd]: Wo · attention,
        RoPE as rope_args says (none when n_rot is 0); stores the layer's K/V in the cache beside the mixer states."""
        c, k = self.config, self.kernels
        n = h.shape[0]
        q, kk, v = self._qkv(L, h, n)
        rope = self.rope_args()
        k.rope(q, pos, *rope)
        k.rope(kk, pos, *rope)
        self._store_kv(cache, il, p0, kk, v)
        a = k.attention(q, cache.k[il], cache.v[il], p0, 0, c.attn_scale)  # [N, H, hd]
        return k.matmul(L.wo, a.reshape(n, c.n_head * c.head_dim))

    def _mamba2(self, il: int, L, h: np.ndarray, cache, p0: int) -> np.ndarray:
        c, k = self.config, self.kernels
        H, P, G, N, conv_dim = mamba2_dims(c)
        d, n = c.ssm_d_inner, h.shape[0]
        zxbcdt = k.matmul(L.ssm_in, h)  # [n, d | conv_dim | H]
        z = zxbcdt[:, :d]
        xbc = self._conv(il, L, np.ascontiguousarray(zxbcdt[:, d:d + conv_dim]), cache, p0)
        x = xbc[:, :d].reshape(n, H, P)
        B = xbc[:, d:d + G * N].reshape(n, G, N)
        C = xbc[:, d + G * N:].reshape(n, G, N)
        dt = softplus(zxbcdt[:, d + conv_dim:] + L.dt_b)  # [n, H]
        S = cache.ssm_state(il, p0)  # [H, P, N]
        y = self._scan(S, x, dt, L.A, B, C)
        cache.set_ssm_state(il, S)
        y += x * L.D[None, :, None]  # the skip
        y = self._gate_norm(y.reshape(n, d), z, L.norm)
        return k.matmul(L.ssm_out, np.ascontiguousarray(y, dtype=np.float32))

    def _conv(self, il: int, L, xbc: np.ndarray, cache, p0: int) -> np.ndarray:
        """silu(causal depthwise conv + bias) of xbc f32 [n, conv_dim]; updates the layer's conv state."""
        K, n = self.config.conv_kernel, xbc.shape[0]
        s = np.concatenate([cache.conv_state(il, p0), xbc])  # [K-1+n, conv_dim]: the state, then the new inputs
        y = s[0:n] * L.conv_w[:, 0]
        for j in range(1, K):
            y += s[j:j + n] * L.conv_w[:, j]
        if L.conv_b is not None:
            y += L.conv_b
        cache.set_conv_state(il, s[n:])
        return self.kernels.silu(np.ascontiguousarray(y, dtype=np.float32))

    def _head_groups(self) -> np.ndarray:
        """The B/C group each head reads: h // (H / G) (llama.cpp's repeat_interleave)."""
        H, _, G, _, _ = mamba2_dims(self.config)
        return np.arange(H) // (H // G)

    def _scan(self, S: np.ndarray, x, dt, A, B, C) -> np.ndarray:
        """Run the scan over n tokens from state S [H, P, N] (updated in place): x [n, H, P], dt [n, H],
        A [H], B and C [n, G, N]; returns y [n, H, P] (without the skip). On the CPU kernels each token is one C
        call (kernels.steps.ssm_scan_step: one pass over the state), for a prefill as for a decode step, so a prompt fed
        in one call or one token at a time goes through the same arithmetic: the K/V cache is f16, and a
        difference in the last bit of an f32 value upstream can round a K/V value to the next f16 step, 4.9e-4
        of it, far above the f32 rounding the two orders would otherwise differ by. Kernels without steps (the
        numpy reference): the loop below, the specification of the C step."""
        steps = self.kernels.steps
        if steps is not None:
            step = steps.ssm_scan_step  # token by token in C, a prefill too: its arithmetic is then a decode step's
            c = np.ascontiguousarray
            x, dt, A, B, C = c(x), c(dt), c(A, dtype=np.float32), c(B), c(C)
            return np.stack([step(S, x[t], dt[t], A, B[t], C[t]) for t in range(x.shape[0])])
        g = self._head_groups()
        Bh, Ch = B[:, g], C[:, g]  # [n, H, N]
        decay = np.exp(dt * A).astype(np.float32)  # [n, H]
        xdt = x * dt[:, :, None]  # [n, H, P]
        y = np.empty(x.shape, dtype=np.float32)
        for t in range(x.shape[0]):
            S *= decay[t][:, None, None]
            S += xdt[t][:, :, None] * Bh[t][:, None, :]
            y[t] = np.einsum("hpn,hn->hp", S, Ch[t])
        return y

    def _gate_norm(self, y: np.ndarray, z: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        """y [n, d_inner] times silu(z), then an RMS norm over each group of d_inner / G values, times w (no norm
        when w is None: a falcon-h1 file without ssm_norm)."""
        c = self.config
        n, G = y.shape[0], c.ssm_n_group
        if w is None:
            return y * self.kernels.silu(np.ascontiguousarray(z))
        g = (y * self.kernels.silu(np.ascontiguousarray(z))).reshape(n, G, -1)
        g = g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + np.float32(c.norm_eps))
        return g.reshape(n, -1) * w
