// axpy.cu: the sparse down projection, y = sum over active j of h[j] * ffn_down_t[rows[j], :].
//
// Split over neurons (the AXPY's long dimension) and columns:
//   grid.x  column tiles: a thread owns one 16-byte chunk of every row it visits (VPL columns), a block of
//           128 threads owns 128 consecutive chunks (n_embd 4096: 4 tiles in F16, 1 in Q4_0), so a warp's
//           loads of one row are 512 contiguous bytes, as in matvec.cu;
//   grid.y  neuron splits: split s visits active entries [s * per, (s + 1) * per) and keeps VPL running sums in
//           registers, then stores them to partials[s][columns] (plain stores: each element has one writer).
// reduce_kernel then adds the splits' partials in split order 0, 1, ... for each column. Nothing is shared
// between writers, so no update can be lost (upstream's CPU AXPY raced on the output), the last split covers
// the tail whatever its length (upstream's CUDA Q4_0 AXPY dropped fewer-than-256 tails), every weight type
// goes through the same decoder (upstream's worked for F16 and Q4_0 only), and the result is deterministic.
// With a device-side count (n_sel_dev) the host does not know n_sel, so `per` is sized for the upper bound
// and splits past the real count store zeros.
// CPU reference: ref.axpy_rows (powerinfer_py/kernels/ref.py).
#include "common.cuh"

namespace {

constexpr int AXPY_THREADS = 128;

template <int T>
__global__ void __launch_bounds__(AXPY_THREADS)
axpy_kernel(const uint8_t *__restrict__ w, int n_rows, int n_cols, const int32_t *__restrict__ rows, int n_sel,
            const int32_t *__restrict__ n_sel_dev, const float *__restrict__ h, int per, float *__restrict__ partials) {
    constexpr int VPL = PiType<T>::VPL;
    const int c = blockIdx.x * AXPY_THREADS + threadIdx.x;
    if (c >= n_cols / VPL) return;
    const int n = n_sel_dev ? min(*n_sel_dev, n_sel) : n_sel;
    const int j_end = min(n, (int)(blockIdx.y + 1) * per);
    float acc[VPL] = {};
    for (int j = blockIdx.y * per; j < j_end; j++) {
        const float hj = h[j];
        if (hj == 0.f) continue;  // a neuron predicted active may still be exactly zero after ReLU
        float wv[VPL];
        pi_decode_chunk<T>(w, rows[j], n_rows, n_cols, c, wv);
#pragma unroll
        for (int i = 0; i < VPL; i++) acc[i] = fmaf(hj, wv[i], acc[i]);
    }
    float4 *out = reinterpret_cast<float4 *>(partials + (size_t)blockIdx.y * n_cols + (size_t)c * VPL);
#pragma unroll
    for (int i = 0; i < VPL / 4; i++) out[i] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
}

__global__ void reduce_kernel(const float *__restrict__ partials, int n_splits, int n_cols, float *__restrict__ y) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n_cols) return;
    float s = 0.f;
    for (int k = 0; k < n_splits; k++) s += partials[(size_t)k * n_cols + c];
    y[c] = s;
}

}  // namespace

extern "C" int pi_cuda_axpy_rows(int type, const void *w, int n_rows, int n_cols, const int32_t *rows, int n_sel,
                                 const int32_t *n_sel_dev, const float *h, int n_splits, float *partials, float *y,
                                 void *stream) {
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    if (n_splits < 1 || n_splits > PI_AXPY_MAX_SPLITS) return (int)cudaErrorInvalidValue;
    if (n_sel <= 0) return (int)cudaMemsetAsync(y, 0, (size_t)n_cols * sizeof(float), s);
    n_splits = n_splits > n_sel ? n_sel : n_splits;
    const int per = (n_sel + n_splits - 1) / n_splits;
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    int vpl;
    switch (type) {
        case PI_F32: vpl = PiType<PI_F32>::VPL; break;
        case PI_F16: vpl = PiType<PI_F16>::VPL; break;
        case PI_Q8_0: vpl = PiType<PI_Q8_0>::VPL; break;
        case PI_Q4_0: vpl = PiType<PI_Q4_0>::VPL; break;
        default: return (int)cudaErrorInvalidValue;
    }
    const int n_chunks = n_cols / vpl;
    const dim3 grid((n_chunks + AXPY_THREADS - 1) / AXPY_THREADS, n_splits), block(AXPY_THREADS);
    switch (type) {
        case PI_F32: axpy_kernel<PI_F32><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_sel, n_sel_dev, h, per, partials); break;
        case PI_F16: axpy_kernel<PI_F16><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_sel, n_sel_dev, h, per, partials); break;
        case PI_Q8_0: axpy_kernel<PI_Q8_0><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_sel, n_sel_dev, h, per, partials); break;
        default: axpy_kernel<PI_Q4_0><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_sel, n_sel_dev, h, per, partials); break;
    }
    int e = pi_launch_status();
    if (e) return e;
    reduce_kernel<<<(n_cols + 255) / 256, 256, 0, s>>>(partials, n_splits, n_cols, y);
    return pi_launch_status();
}
