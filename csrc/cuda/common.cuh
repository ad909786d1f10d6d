// common.cuh: what every kernel file shares: warp reductions, type ids, and the 16-byte chunk decoders.
//
// The unit of work everywhere is one 16-byte chunk of a weight row, read with one 128-bit load:
//   F32: 4 values, F16: 8 values, Q8_0: 16 values (+ the block's f16 scale), Q4_0: 32 values (one whole
//   block of nibbles + its scale).
// A warp therefore covers 32 chunks = 512 contiguous bytes of a row per step (fully coalesced), and every
// row length we accept is a whole number of chunks (pi_cuda.h), so no kernel has a tail loop.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "pi_cuda.h"

#define PI_WARP 32
#define PI_FULL_MASK 0xffffffffu

enum { PI_F32 = 0, PI_F16 = 1, PI_Q4_0 = 2, PI_Q8_0 = 8 };
enum { PI_AXPY_MAX_SPLITS = 64 };  // placement.py's AXPY_SPLITS sizes the partials buffer from this

static inline int pi_launch_status(void) { return (int)cudaGetLastError(); }

__device__ __forceinline__ float pi_warp_sum(float v) {
    for (int o = PI_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(PI_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float pi_warp_max(float v) {
    for (int o = PI_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(PI_FULL_MASK, v, o));
    return v;
}

// Values per 16-byte chunk (VPL) and bytes of one row of the quant (or value) plane.
template <int T> struct PiType;
template <> struct PiType<PI_F32> { static constexpr int VPL = 4; };
template <> struct PiType<PI_F16> { static constexpr int VPL = 8; };
template <> struct PiType<PI_Q8_0> { static constexpr int VPL = 16; };
template <> struct PiType<PI_Q4_0> { static constexpr int VPL = 32; };

__host__ __device__ __forceinline__ size_t pi_plane_row_bytes(int type, int n_cols) {
    switch (type) {
        case PI_F32: return (size_t)n_cols * 4;
        case PI_F16: return (size_t)n_cols * 2;
        case PI_Q8_0: return (size_t)n_cols;
        default: return (size_t)n_cols / 2;  // Q4_0
    }
}

// Decode chunk c of row `row` into v[VPL] (f32). `w` is the tensor's base (planar for Q8_0 / Q4_0).
template <int T>
__device__ __forceinline__ void pi_decode_chunk(const uint8_t *__restrict__ w, int64_t row, int n_rows, int n_cols,
                                                int c, float *v) {
    const size_t row_bytes = pi_plane_row_bytes(T, n_cols);
    const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(w + (size_t)row * row_bytes) + c);
    if constexpr (T == PI_F32) {
        v[0] = __uint_as_float(raw.x); v[1] = __uint_as_float(raw.y);
        v[2] = __uint_as_float(raw.z); v[3] = __uint_as_float(raw.w);
    } else if constexpr (T == PI_F16) {
        const __half2 *p = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(p[i]);
            v[2 * i] = f.x; v[2 * i + 1] = f.y;
        }
    } else {
        const __half *scales = reinterpret_cast<const __half *>(w + (size_t)n_rows * row_bytes);
        const int8_t *q = reinterpret_cast<const int8_t *>(&raw);
        if constexpr (T == PI_Q8_0) {  // chunk c = half c & 1 of block c / 2
            const float d = __half2float(scales[(size_t)row * (n_cols / 32) + c / 2]);
#pragma unroll
            for (int i = 0; i < 16; i++) v[i] = d * (float)q[i];
        } else {  // Q4_0: chunk c = block c
            const float d = __half2float(scales[(size_t)row * (n_cols / 32) + c]);
#pragma unroll
            for (int i = 0; i < 16; i++) {
                const int b = (uint8_t)q[i];
                v[i] = d * (float)((b & 15) - 8);
                v[i + 16] = d * (float)((b >> 4) - 8);
            }
        }
    }
}

// x values of chunk c (f32, 16-byte aligned: VPL / 4 float4 loads).
template <int VPL>
__device__ __forceinline__ void pi_load_x(const float *__restrict__ x, int c, float *v) {
    const float4 *p = reinterpret_cast<const float4 *>(x + (size_t)c * VPL);
#pragma unroll
    for (int i = 0; i < VPL / 4; i++) {
        float4 f = p[i];
        v[4 * i] = f.x; v[4 * i + 1] = f.y; v[4 * i + 2] = f.z; v[4 * i + 3] = f.w;
    }
}
