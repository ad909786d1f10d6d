"""Kernels: the numpy specification (ref) and the C implementation reached through cffi (cpu).

Both expose the same operations with the same names and argument order:

    matmul(w: Tensor, x)            x f32 [K] or [N, K] -> f32 [M] or [N, M]   (w has shape (M, K))
    get_rows(w: Tensor, ids)        int32 [N] -> f32 [N, K]                    (embedding lookup)
    rmsnorm(x, w, eps)              x f32 [..., D], w f32 [D] or None
    layernorm(x, w, b, eps)
    rope(x, pos, n_rot, freq_base, freq_scale, neox, freq_factors=None)   x f32 [N, H, D], rotated in place
                                                       and returned (freq_factors: f32 [n_rot/2] or None)
    softmax(x)                      last dim, in place and returned
    attention(q, k, v, pos0, window, scale, softcap=0.0, sinks=None)   q f32 [N, H, D], k/v f16 [Hkv, n_ctx, D] -> f32 [N, H, D]
                                                       (softcap > 0: scores squashed to softcap * tanh(s / softcap))
    store_kv(dst, p0, x)            x f32 [N, Hkv, D] into the f16 cache plane dst [Hkv, n_ctx, D] at p0..p0+N-1
    relu(x), silu(x), gelu(x)       new arrays
    swiglu(g, u), geglu(g, u)       silu(g) * u, gelu(g) * u

plus module-level quantize(x, type) and dequantize(tensor). `ref` has them as module functions; `cpu` as methods
of CpuKernels, which owns a thread pool. `ref.RefKernels` wraps the module functions in the same class shape,
so a model can run on either.
"""
