// attention.cu: causal grouped-query attention of new tokens over the device KV cache (f16, the host
// cache's layout: [n_head_kv, n_ctx, head_dim]).
//
// One block of 4 warps per (query head, token). Each warp walks every 4th visible position with an online
// softmax: lane l holds dims l, l + 32, ... of q (pre-scaled) and of its running output, a shuffle sum gives
// the score, and (max, sum, output) are rescaled as the max grows. The 4 warps' states are merged at the end
// in shared memory. Scores never touch memory, so any context length works with 4 KiB of shared memory.
// head_dim = 32 * DPL, DPL in {1, 2, 4, 8} (head_dim 32..256).
// CPU reference: ref.attention.
#include <math.h>

#include "common.cuh"

namespace {

constexpr int ATT_WARPS = 4;

template <int DPL>
__global__ void __launch_bounds__(ATT_WARPS * PI_WARP)
attention_kernel(const float *__restrict__ q, const __half *__restrict__ k, const __half *__restrict__ v,
                 float *__restrict__ out, int n_head, int n_head_kv, int n_ctx, int pos0, int window, float scale) {
    constexpr int D = DPL * PI_WARP;
    __shared__ float s_max[ATT_WARPS], s_sum[ATT_WARPS], s_out[ATT_WARPS][D];
    const int head = blockIdx.x, t = blockIdx.y;
    const int lane = threadIdx.x % PI_WARP, warp = threadIdx.x / PI_WARP;
    const int kv_head = head / (n_head / n_head_kv);
    const float *qr = q + ((size_t)t * n_head + head) * D;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qv[i] = qr[lane + PI_WARP * i] * scale;
        acc[i] = 0.f;
    }
    const int p = pos0 + t;
    const int j0 = window > 0 ? max(0, p - window + 1) : 0;
    float m = -INFINITY, l = 0.f;
    const __half *kb = k + (size_t)kv_head * n_ctx * D, *vb = v + (size_t)kv_head * n_ctx * D;
    for (int j = j0 + warp; j <= p; j += ATT_WARPS) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; i++) s = fmaf(qv[i], __half2float(kb[(size_t)j * D + lane + PI_WARP * i]), s);
        s = pi_warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float corr = expf(m - m_new), pw = expf(s - m_new);
        l = l * corr + pw;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] = acc[i] * corr + pw * __half2float(vb[(size_t)j * D + lane + PI_WARP * i]);
        m = m_new;
    }
    if (lane == 0) {
        s_max[warp] = m;
        s_sum[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) s_out[warp][lane + PI_WARP * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float big = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) big = fmaxf(big, s_max[w]);
    float denom = 0.f;
    for (int w = 0; w < ATT_WARPS; w++) denom += s_max[w] == -INFINITY ? 0.f : s_sum[w] * expf(s_max[w] - big);
    float *o = out + ((size_t)t * n_head + head) * D;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        float num = 0.f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (s_max[w] != -INFINITY) num += s_out[w][lane + PI_WARP * i] * expf(s_max[w] - big);
        o[lane + PI_WARP * i] = num / denom;
    }
}

}  // namespace

extern "C" int pi_cuda_attention(const float *q, const uint16_t *k, const uint16_t *v, float *out, int n_tok,
                                 int n_head, int n_head_kv, int head_dim, int n_ctx, int pos0, int window,
                                 float scale, void *stream) {
    if (n_tok <= 0) return 0;
    if (n_head_kv <= 0 || n_head % n_head_kv) return (int)cudaErrorInvalidValue;
    const dim3 grid(n_head, n_tok), block(ATT_WARPS * PI_WARP);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    const __half *kh = reinterpret_cast<const __half *>(k), *vh = reinterpret_cast<const __half *>(v);
    switch (head_dim) {
        case 32: attention_kernel<1><<<grid, block, 0, s>>>(q, kh, vh, out, n_head, n_head_kv, n_ctx, pos0, window, scale); break;
        case 64: attention_kernel<2><<<grid, block, 0, s>>>(q, kh, vh, out, n_head, n_head_kv, n_ctx, pos0, window, scale); break;
        case 128: attention_kernel<4><<<grid, block, 0, s>>>(q, kh, vh, out, n_head, n_head_kv, n_ctx, pos0, window, scale); break;
        case 256: attention_kernel<8><<<grid, block, 0, s>>>(q, kh, vh, out, n_head, n_head_kv, n_ctx, pos0, window, scale); break;
        default: return (int)cudaErrorInvalidValue;
    }
    return pi_launch_status();
}
