// norm_rope.cu: RMSNorm and RoPE on the device, so a resident layer's attention never leaves the GPU.
//   rmsnorm  one block of 256 threads per token: strided sum of squares, warp shuffles, 8 warp sums in
//            shared memory, then the scaled copy. fp32 throughout.
//   rope     one thread per (token, head, pair); the angle is computed in double (positions reach 10^5 and
//            an f32 angle would be off by ~1e-3 rad there), its sine and cosine applied in f32.
// CPU reference: ref.rmsnorm, ref.rope.
#include "common.cuh"

namespace {

constexpr int NORM_THREADS = 256;

__global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_kernel(const float *__restrict__ x, const float *__restrict__ w, float *__restrict__ y, int dim, float eps) {
    __shared__ float warp_sums[NORM_THREADS / PI_WARP];
    __shared__ float scale;
    const float *xr = x + (size_t)blockIdx.x * dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) ss = fmaf(xr[i], xr[i], ss);
    ss = pi_warp_sum(ss);
    if (threadIdx.x % PI_WARP == 0) warp_sums[threadIdx.x / PI_WARP] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int k = 0; k < NORM_THREADS / PI_WARP; k++) t += warp_sums[k];
        scale = rsqrtf(t / (float)dim + eps);
    }
    __syncthreads();
    float *yr = y + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) yr[i] = xr[i] * scale * (w ? w[i] : 1.f);
}

__global__ void rope_kernel(float *__restrict__ x, const int32_t *__restrict__ pos, int n_tok, int n_head,
                            int head_dim, int n_rot, float freq_base, float freq_scale, int neox,
                            const float *__restrict__ ff, float mscale) {
    const int half = n_rot / 2;
    const long long id = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (long long)n_tok * n_head * half) return;
    const int i = (int)(id % half);
    const int head = (int)((id / half) % n_head);
    const int t = (int)(id / ((long long)half * n_head));
    const double theta = (double)pos[t] * (double)freq_scale * pow((double)freq_base, -2.0 * i / n_rot) /
                         (ff ? (double)ff[i] : 1.0);
    const float c = (float)cos(theta) * mscale, s = (float)sin(theta) * mscale;
    float *v = x + ((size_t)t * n_head + head) * head_dim;
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = v[ia], b = v[ib];
    v[ia] = a * c - b * s;
    v[ib] = a * s + b * c;
}

}  // namespace

extern "C" int pi_cuda_rmsnorm(const float *x, const float *w, float *y, int n_tok, int dim, float eps, void *stream) {
    if (n_tok <= 0) return 0;
    rmsnorm_kernel<<<n_tok, NORM_THREADS, 0, reinterpret_cast<cudaStream_t>(stream)>>>(x, w, y, dim, eps);
    return pi_launch_status();
}

extern "C" int pi_cuda_rope(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim, int n_rot,
                            float freq_base, float freq_scale, int neox, const float *freq_factors,
                            float mscale, void *stream) {
    const long long n = (long long)n_tok * n_head * (n_rot / 2);
    if (n <= 0) return 0;
    const int threads = 256;
    rope_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
        x, pos, n_tok, n_head, head_dim, n_rot, freq_base, freq_scale, neox, freq_factors, mscale);
    return pi_launch_status();
}
