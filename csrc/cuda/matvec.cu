// matvec.cu: dense mat-vec (pi_cuda_matvec) and the row-gather mat-vec over an active list
// (pi_cuda_matvec_rows), for F32 / F16 / Q8_0 / Q4_0 weights, fp32 accumulation.
//
// Variants (one template, matvec_kernel<T, GATHER>):
//   dense   warp w computes rows R*w .. R*w + R-1 of the weight
//   gather  warp w computes compact outputs R*w.., reading weight rows rows[j]; a device-side count (from the
//           predictor) ends the grid early: warps past it return before loading anything.
// Tile shape, derived rather than searched:
//   - a lane reads one 16-byte chunk per step (128-bit load): a warp reads 512 contiguous bytes of a row per
//     step, the width of four 128-byte cache lines, fully coalesced (common.cuh);
//   - R = 2 rows per warp: the lane's x chunk (VPL floats, up to 32 for Q4_0) is loaded once and used twice,
//     halving x traffic from L1, while the Q4_0 variant stays at 63 registers without spills (ptxas -v,
//     sm_90), so 8 blocks of 128 threads fit an SM's register file; more rows per warp trade occupancy;
//   - 4 warps per block (128 threads, 8 rows): small blocks keep the last wave short at n_ff = 11008
//     (1376 blocks) and let the gather variant stop at 8-row granularity; a 32-neuron placement group is
//     exactly 4 blocks, so a device-resident hot set never leaves a block half used;
//   - the row's partial sums meet in one 5-step shuffle reduction, lane 0 writes.
// CPU reference: powerinfer_py/kernels/ref.py (matmul, matmul_rows); tests/test_cuda.py compares them.
#include "common.cuh"

namespace {

constexpr int ROWS_PER_WARP = 2;
constexpr int WARPS_PER_BLOCK = 4;
constexpr int ROWS_PER_BLOCK = ROWS_PER_WARP * WARPS_PER_BLOCK;

template <int T, bool GATHER>
__global__ void __launch_bounds__(WARPS_PER_BLOCK * PI_WARP)
matvec_kernel(const uint8_t *__restrict__ w, int n_rows, int n_cols, const int32_t *__restrict__ rows, int n_out,
              const int32_t *__restrict__ n_out_dev, const float *__restrict__ x, float *__restrict__ y, int relu) {
    constexpr int VPL = PiType<T>::VPL;
    const int lane = threadIdx.x % PI_WARP;
    const int j0 = (blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / PI_WARP) * ROWS_PER_WARP;
    const int n = n_out_dev ? min(*n_out_dev, n_out) : n_out;
    if (j0 >= n) return;  // whole warp leaves together: the shuffles below stay convergent
    int64_t row[ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        const int j = j0 + r;
        row[r] = j < n ? (GATHER ? (int64_t)rows[j] : (int64_t)j) : -1;
    }
    float acc[ROWS_PER_WARP] = {};
    const int n_chunks = n_cols / VPL;
    for (int c = lane; c < n_chunks; c += PI_WARP) {
        float xv[VPL];
        pi_load_x<VPL>(x, c, xv);
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; r++) {
            if (row[r] < 0) continue;
            float wv[VPL];
            pi_decode_chunk<T>(w, row[r], n_rows, n_cols, c, wv);
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < VPL; i++) s = fmaf(wv[i], xv[i], s);
            acc[r] += s;
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; r++) {
        const float s = pi_warp_sum(acc[r]);
        if (lane == 0 && j0 + r < n) y[j0 + r] = relu ? fmaxf(s, 0.f) : s;
    }
}

template <bool GATHER>
int launch(int type, const void *w, int n_rows, int n_cols, const int32_t *rows, int n_out, const int32_t *n_dev,
           const float *x, float *y, int relu, cudaStream_t s) {
    if (n_out <= 0) return 0;
    const dim3 grid((n_out + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK), block(WARPS_PER_BLOCK * PI_WARP);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    switch (type) {
        case PI_F32: matvec_kernel<PI_F32, GATHER><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_out, n_dev, x, y, relu); break;
        case PI_F16: matvec_kernel<PI_F16, GATHER><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_out, n_dev, x, y, relu); break;
        case PI_Q8_0: matvec_kernel<PI_Q8_0, GATHER><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_out, n_dev, x, y, relu); break;
        case PI_Q4_0: matvec_kernel<PI_Q4_0, GATHER><<<grid, block, 0, s>>>(wb, n_rows, n_cols, rows, n_out, n_dev, x, y, relu); break;
        default: return (int)cudaErrorInvalidValue;
    }
    return pi_launch_status();
}

}  // namespace

extern "C" int pi_cuda_matvec(int type, const void *w, int n_rows, int n_cols, const float *x, float *y, int relu,
                              void *stream) {
    return launch<false>(type, w, n_rows, n_cols, nullptr, n_rows, nullptr, x, y, relu,
                         reinterpret_cast<cudaStream_t>(stream));
}

extern "C" int pi_cuda_matvec_rows(int type, const void *w, int n_rows, int n_cols, const int32_t *rows, int n_sel,
                                   const int32_t *n_sel_dev, const float *x, float *y, void *stream) {
    return launch<true>(type, w, n_rows, n_cols, rows, n_sel, n_sel_dev, x, y, 0,
                        reinterpret_cast<cudaStream_t>(stream));
}
