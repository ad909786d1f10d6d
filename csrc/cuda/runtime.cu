// runtime.cu: device setup, memory and streams behind the C ABI (pi_cuda.h). Thin: each function forwards to
// the CUDA runtime and returns its error code, so Python can say exactly what failed (35 = no driver).
#include <string.h>

#include "common.cuh"

static cudaStream_t as_stream(void *s) { return reinterpret_cast<cudaStream_t>(s); }

extern "C" int pi_cuda_init(int device, char *name, int name_len, size_t *free_bytes, size_t *total_bytes) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return (int)e;
    if (device < 0 || device >= count) return (int)cudaErrorInvalidDevice;
    if ((e = cudaSetDevice(device)) != cudaSuccess) return (int)e;
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess) return (int)e;
    if (name && name_len > 0) {
        strncpy(name, prop.name, (size_t)name_len - 1);
        name[name_len - 1] = '\0';
    }
    size_t f = 0, t = 0;
    if ((e = cudaMemGetInfo(&f, &t)) != cudaSuccess) return (int)e;
    if (free_bytes) *free_bytes = f;
    if (total_bytes) *total_bytes = t;
    return 0;
}

extern "C" const char *pi_cuda_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }

extern "C" int pi_cuda_malloc(void **ptr, size_t n_bytes) { return (int)cudaMalloc(ptr, n_bytes); }
extern "C" int pi_cuda_free(void *ptr) { return (int)cudaFree(ptr); }

extern "C" int pi_cuda_memcpy_h2d(void *dst, const void *src, size_t n, void *stream) {
    return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, as_stream(stream));
}
extern "C" int pi_cuda_memcpy_d2h(void *dst, const void *src, size_t n, void *stream) {
    return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, as_stream(stream));
}
extern "C" int pi_cuda_memcpy_d2d(void *dst, const void *src, size_t n, void *stream) {
    return (int)cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, as_stream(stream));
}
extern "C" int pi_cuda_memset(void *dst, int value, size_t n, void *stream) {
    return (int)cudaMemsetAsync(dst, value, n, as_stream(stream));
}

extern "C" int pi_cuda_stream_create(void **stream) {
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *stream = e == cudaSuccess ? reinterpret_cast<void *>(s) : nullptr;
    return (int)e;
}
extern "C" int pi_cuda_stream_destroy(void *stream) { return (int)cudaStreamDestroy(as_stream(stream)); }
extern "C" int pi_cuda_stream_sync(void *stream) { return (int)cudaStreamSynchronize(as_stream(stream)); }
