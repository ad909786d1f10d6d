// predictor.cu: the sparse FFN's device-side control flow: predictor -> compact active list -> activation.
//
//   pi_cuda_predictor      hidden = relu(fc1 . p) and logits = fc2 . hidden (two matvec.cu launches), then
//                          pi_cuda_select_active on the logits. The active list stays on the device; the
//                          gather and AXPY kernels read its count from device memory.
//   pi_cuda_select_active  one block of 1024 threads walks the logits in 1024-wide tiles: a warp ballot marks
//                          the active lanes, popc of the ballot below a lane is its rank in the warp, a scan of
//                          the 32 warp totals places the warp, and a running base places the tile. The list
//                          comes out ascending, as the CPU's pi_select_active makes it, with no atomics.
//                          n_ff is at most a few 10^4, so one block (11 tiles at n_ff 11008) costs microseconds.
//   pi_cuda_ffn_act        h from gating and up values, elementwise over the compact active list.
// CPU reference: ref.select_active, FFN._gate_act / _combine (powerinfer_py/layers/ffn.py).
#include "common.cuh"

namespace {

constexpr int SELECT_THREADS = 1024;

__global__ void __launch_bounds__(SELECT_THREADS)
select_kernel(const float *__restrict__ logits, int n, float threshold, int32_t *__restrict__ active,
              int32_t *__restrict__ n_active) {
    __shared__ int warp_total[SELECT_THREADS / PI_WARP];
    __shared__ int base;
    const int lane = threadIdx.x % PI_WARP, warp = threadIdx.x / PI_WARP;
    if (threadIdx.x == 0) base = 0;
    __syncthreads();
    for (int tile = 0; tile < n; tile += SELECT_THREADS) {
        const int i = tile + threadIdx.x;
        const bool on = i < n && logits[i] >= threshold;  // NaN compares false: never active
        const unsigned ballot = __ballot_sync(PI_FULL_MASK, on);
        if (lane == 0) warp_total[warp] = __popc(ballot);
        __syncthreads();
        int offset = base;
        for (int k = 0; k < warp; k++) offset += warp_total[k];
        if (on) active[offset + __popc(ballot & ((1u << lane) - 1u))] = i;
        __syncthreads();  // everyone has read base and warp_total before they change
        if (threadIdx.x == 0) {
            int t = 0;
            for (int k = 0; k < SELECT_THREADS / PI_WARP; k++) t += warp_total[k];
            base += t;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *n_active = base;
}

__global__ void ffn_act_kernel(int variant, const float *__restrict__ g, const float *__restrict__ u,
                               const float *__restrict__ b, float *__restrict__ h, int n,
                               const int32_t *__restrict__ n_dev, float param) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= (n_dev ? min(*n_dev, n) : n)) return;
    const float a = g[j];
    switch (variant) {
        case 0: h[j] = fmaxf(a, 0.f) * u[j]; break;
        case 1: h[j] = (a > param ? a : 0.f) * u[j]; break;
        case 2: h[j] = fmaxf(a, 0.f) * fmaxf(u[j], 0.f); break;
        default: h[j] = fmaxf(b ? a + b[j] : a, 0.f); break;
    }
}

}  // namespace

extern "C" int pi_cuda_select_active(const float *logits, int n, float threshold, int32_t *active,
                                     int32_t *n_active, void *stream) {
    select_kernel<<<1, SELECT_THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(logits, n, threshold, active,
                                                                                    n_active);
    return pi_launch_status();
}

extern "C" int pi_cuda_predictor(int type1, const void *fc1, int type2, const void *fc2, int rank, int n_ff,
                                 int n_embd, const float *p, float threshold, float *hidden, float *logits,
                                 int32_t *active, int32_t *n_active, void *stream) {
    int e = pi_cuda_matvec(type1, fc1, rank, n_embd, p, hidden, 1, stream);
    if (!e) e = pi_cuda_matvec(type2, fc2, n_ff, rank, hidden, logits, 0, stream);
    if (!e) e = pi_cuda_select_active(logits, n_ff, threshold, active, n_active, stream);
    return e;
}

extern "C" int pi_cuda_ffn_act(int variant, const float *g, const float *u, const float *b, float *h, int n,
                               const int32_t *n_dev, float param, void *stream) {
    if (n <= 0) return 0;
    const int threads = 256;
    ffn_act_kernel<<<(n + threads - 1) / threads, threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
        variant, g, u, b, h, n, n_dev, param);
    return pi_launch_status();
}
