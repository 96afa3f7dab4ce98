// Host-only stand-in for libcudart: runs fna-gpu-test's host code (harness, reference, checks and
// every backend's host path: validation, tiling, workspace, launch configuration) on a machine
// without a GPU. Kernels are not executed, so every device case FAILs (NaN outputs); what it
// finds is host crashes (it found a division by a zero tile extent) without spending device time.
//   gcc -shared -fPIC -O1 tools/experiments/cudart_shim.c -o /tmp/libcudart_shim.so
//   LD_PRELOAD=/tmp/libcudart_shim.so ./build/<dir>/fna-gpu-test --backend cuda-fused --filter bwd
// Attribute numbers: 75/76 compute capability major/minor, 97 opt-in shared memory per block.
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
typedef int cudaError_t;
typedef void* cudaStream_t;
struct dim3 { unsigned x, y, z; };
struct cudaPointerAttributes { int type; int device; void* devicePointer; void* hostPointer; };
cudaError_t cudaGetDeviceCount(int* n) { *n = 1; return 0; }
cudaError_t cudaGetDevice(int* d) { *d = 0; return 0; }
cudaError_t cudaSetDevice(int d) { return d == 0 ? 0 : 101; }
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) { memset(a, 0, sizeof *a); a->type = 2; a->device = 0; return 0; }
cudaError_t cudaMalloc(void** p, size_t n) { return posix_memalign(p, 256, n ? n : 1) ? 2 : 0; }
cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) { (void)s; return cudaMalloc(p, n); }
cudaError_t cudaFree(void* p) { free(p); return 0; }
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { (void)s; free(p); return 0; }
cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFreeHost(void* p) { free(p); return 0; }
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, int k) { (void)k; memcpy(d, s, n); return 0; }
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, int k, cudaStream_t st) { (void)k; (void)st; memcpy(d, s, n); return 0; }
cudaError_t cudaMemset(void* d, int v, size_t n) { memset(d, v, n); return 0; }
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t s) { (void)s; memset(d, v, n); return 0; }
cudaError_t cudaDeviceGetAttribute(int* v, int attr, int dev) { (void)dev; *v = attr == 75 ? 9 : attr == 76 ? 0 : attr == 97 ? 232448 : 1024; return 0; }
cudaError_t cudaFuncSetAttribute(const void* f, int a, int v) { (void)f; (void)a; (void)v; return 0; }
cudaError_t cudaLaunchKernel(const void* f, struct dim3 g, struct dim3 b, void** a, size_t sm, cudaStream_t s) { (void)f; (void)a; (void)sm; (void)s; if (!g.x || !g.y || !g.z || !b.x) return 9; return 0; }
cudaError_t __cudaLaunchKernel(const void* f, struct dim3 g, struct dim3 b, void** a, size_t sm, cudaStream_t s) { return cudaLaunchKernel(f, g, b, a, sm, s); }
unsigned __cudaPushCallConfiguration(struct dim3 g, struct dim3 b, size_t sm, void* s) { (void)g; (void)b; (void)sm; (void)s; return 0; }
cudaError_t __cudaPopCallConfiguration(struct dim3* g, struct dim3* b, size_t* sm, void* s) { g->x = g->y = g->z = 1; b->x = b->y = b->z = 1; *sm = 0; (void)s; return 0; }
static int fatbin_handle;
void** __cudaRegisterFatBinary(void* f) { (void)f; return (void**)&fatbin_handle; }
void __cudaRegisterFatBinaryEnd(void** h) { (void)h; }
void __cudaUnregisterFatBinary(void** h) { (void)h; }
void __cudaRegisterFunction(void** h, const char* hf, char* df, const char* dn, int t, void* ti, void* bi, void* bd, void* gd, int* w) { (void)h; (void)hf; (void)df; (void)dn; (void)t; (void)ti; (void)bi; (void)bd; (void)gd; (void)w; }
void __cudaRegisterVar(void** h, char* hv, char* dva, const char* dvn, int ext, size_t size, int c, int g) { (void)h; (void)hv; (void)dva; (void)dvn; (void)ext; (void)size; (void)c; (void)g; }
cudaError_t __cudaGetKernel(void** k, const void* f) { *k = (void*)f; return 0; }
cudaError_t cudaGetLastError(void) { return 0; }
cudaError_t cudaPeekAtLastError(void) { return 0; }
const char* cudaGetErrorString(cudaError_t e) { (void)e; return "shim error"; }
const char* cudaGetErrorName(cudaError_t e) { (void)e; return "shim"; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned f) { (void)f; *s = (void*)1; return 0; }
cudaError_t cudaStreamCreate(cudaStream_t* s) { *s = (void*)1; return 0; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { (void)s; return 0; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return 0; }
cudaError_t cudaDeviceSynchronize(void) { return 0; }
cudaError_t cudaMemGetInfo(size_t* f, size_t* t) { *f = (size_t)64 << 30; *t = (size_t)80 << 30; return 0; }
