/*
 * Internal interfaces of the interception library. Nothing here is exported: the library is
 * built with -fvisibility=hidden and only the hooks in hook.c carry GS_EXPORT.
 */
#ifndef GPUSHARE_INTERNAL_H
#define GPUSHARE_INTERNAL_H

#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gpushare/driver_types.h"

#define GS_EXPORT __attribute__((visibility("default")))
/* For the code a sanitizer runtime can reach (through dlsym) before it is initialised. */
#define GS_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

#define GS_MAX_DEVICES 16
#define GS_DEFAULT_CTX_OVERHEAD (300ull << 20)
#define GS_OOM_EXIT_STATUS 12 /* ENOMEM; documented in docs/isolation.md */

/* ---- real.c: the real driver / NVML entry points ---------------------------------------- */

/* Entry points we hook (exported from hook.c with these exact names). */
#define GS_CUDA_HOOKS(X)                                                                         \
    X(cuMemAlloc_v2)                                                                             \
    X(cuMemAllocPitch_v2)                                                                        \
    X(cuMemAllocManaged)                                                                         \
    X(cuMemAllocAsync)                                                                           \
    X(cuMemAllocAsync_ptsz)                                                                      \
    X(cuMemAllocFromPoolAsync)                                                                   \
    X(cuMemAllocFromPoolAsync_ptsz)                                                              \
    X(cuMemFree_v2)                                                                              \
    X(cuMemFreeAsync)                                                                            \
    X(cuMemFreeAsync_ptsz)                                                                       \
    X(cuMemCreate)                                                                               \
    X(cuMemRelease)                                                                              \
    X(cuArrayCreate_v2)                                                                          \
    X(cuArray3DCreate_v2)                                                                        \
    X(cuArrayDestroy)                                                                            \
    X(cuMipmappedArrayCreate)                                                                    \
    X(cuMipmappedArrayDestroy)                                                                   \
    X(cuCtxCreate_v2)                                                                            \
    X(cuCtxDestroy_v2)                                                                           \
    X(cuDevicePrimaryCtxRetain)                                                                  \
    X(cuDevicePrimaryCtxRelease_v2)                                                              \
    X(cuDevicePrimaryCtxRelease)                                                                 \
    X(cuMemGetInfo_v2)                                                                           \
    X(cuDeviceTotalMem_v2)                                                                       \
    X(cuLaunchKernel)                                                                            \
    X(cuLaunchKernel_ptsz)                                                                       \
    X(cuLaunchCooperativeKernel)                                                                 \
    X(cuLaunchCooperativeKernel_ptsz)                                                            \
    X(cuGraphLaunch)                                                                             \
    X(cuGraphLaunch_ptsz)                                                                        \
    X(cuGetProcAddress)                                                                          \
    X(cuGetProcAddress_v2)                                                                       \
    X(cuLaunchKernelEx)                                                                          \
    X(cuLaunchKernelEx_ptsz)                                                                     \
    X(cuMemPoolTrimTo)                                                                           \
    X(cuMemPoolCreate)                                                                           \
    X(cuMemPoolDestroy)                                                                          \
    X(cuDeviceGetMemPool)                                                                        \
    X(cuDeviceGetDefaultMemPool)                                                                 \
    X(cuCtxCreate_v3)                                                                            \
    X(cuCtxCreate_v4)                                                                            \
    GS_CUDA_LEGACY_HOOKS(X)

/* The pre-_v2 entry points (32-bit sizes and device pointers) that old binaries call directly
 * and that cuGetProcAddress hands out for versions below 3020 (cuCtxDestroy: below 4000). */
#define GS_CUDA_LEGACY_HOOKS(X)                                                                  \
    X(cuMemAlloc)                                                                                \
    X(cuMemAllocPitch)                                                                           \
    X(cuMemFree)                                                                                 \
    X(cuMemGetInfo)                                                                              \
    X(cuDeviceTotalMem)                                                                          \
    X(cuCtxCreate)                                                                               \
    X(cuCtxDestroy)                                                                              \
    X(cuArrayCreate)                                                                             \
    X(cuArray3DCreate)

#define GS_NVML_HOOKS(X)                                                                         \
    X(nvmlDeviceGetMemoryInfo)                                                                   \
    X(nvmlDeviceGetMemoryInfo_v2)                                                                \
    X(nvmlDeviceGetComputeRunningProcesses_v3)                                                   \
    X(nvmlDeviceGetComputeRunningProcesses_v2)                                                   \
    X(nvmlDeviceGetComputeRunningProcesses)

/* NVML process-list entry points that driver_types.h (the mock's header) does not declare. The
 * plain one fills nvmlProcessInfo_v1_t (no instance ids); _v2 has the _v3 layout. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} gs_nvmlProcessInfo_v1_t;
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                  gs_nvmlProcessInfo_v1_t *infos);

/* Entry points we only call. */
#define GS_CUDA_AUX(X)                                                                           \
    X(cuCtxGetDevice)                                                                            \
    X(cuCtxGetCurrent)                                                                           \
    X(cuCtxSetCurrent)                                                                           \
    X(cuStreamGetCtx)                                                                            \
    X(cuMemPoolGetAttribute)

#define GS_NVML_AUX(X)                                                                           \
    X(nvmlInit_v2)                                                                               \
    X(nvmlDeviceGetIndex)                                                                        \
    X(nvmlDeviceGetHandleByIndex_v2)                                                             \
    X(nvmlDeviceGetUtilizationRates)

#define GS_ENUM(name) GS_FN_##name,
enum gs_cuda_fn { GS_CUDA_HOOKS(GS_ENUM) GS_CUDA_AUX(GS_ENUM) GS_CUDA_FN_COUNT };
enum gs_nvml_fn { GS_NVML_HOOKS(GS_ENUM) GS_NVML_AUX(GS_ENUM) GS_NVML_FN_COUNT };
#undef GS_ENUM

#define GS_COUNT_ONE(name) +1
enum {
    GS_CUDA_HOOK_COUNT = 0 GS_CUDA_HOOKS(GS_COUNT_ONE),
    GS_NVML_HOOK_COUNT = 0 GS_NVML_HOOKS(GS_COUNT_ONE),
};
#undef GS_COUNT_ONE

/* The dlsym that glibc provides (never our override). Safe to call before any initialisation. */
void *gs_real_dlsym(void *handle, const char *symbol);
typedef void *(*gs_dlsym_fn)(void *, const char *);
gs_dlsym_fn gs_real_dlsym_fn(void);
/* Resolve libcuda.so.1 (once, thread-safe). Returns 0 when loaded. */
int gs_real_cuda_load(void);
int gs_real_nvml_load(void);
/* Real entry point, or NULL when the driver lacks it. Loads the library on first use. */
void *gs_real_cuda(enum gs_cuda_fn fn);
void *gs_real_nvml(enum gs_nvml_fn fn);
const char *gs_cuda_fn_name(enum gs_cuda_fn fn);
/* Non-zero while this thread is inside the library's own initialisation (recursion guard). */
int gs_in_init(void);
void gs_enter_init(void);
void gs_leave_init(void);

/* ---- config.c -------------------------------------------------------------------------- */

typedef enum { GS_OOM_FAIL = 0, GS_OOM_EXIT = 1 } gs_oom_policy;

struct gs_config {
    int from_file;                         /* the limits file existed and was used */
    uint64_t default_limit;                /* 0: none */
    uint64_t device_limit[GS_MAX_DEVICES]; /* 0: use default_limit */
    unsigned core_limit_percent;           /* 0: no compute limit */
    uint64_t ctx_overhead;
    gs_oom_policy oom_policy;
    char state_dir[PATH_MAX - 32];
};

/* Returns 0 on success; on error prints one line to stderr and returns -1. */
int gs_config_load(struct gs_config *config);
/* Limit in bytes for device index, 0 when unlimited. */
uint64_t gs_config_limit(const struct gs_config *config, int device);
/* Parses "10GiB", "512MiB", "4096"; returns 0 on success. */
int gs_parse_bytes(const char *text, uint64_t *out);
/* Formats bytes as "9.5 GiB" into buf. */
void gs_format_bytes(uint64_t bytes, char *buf, size_t size);

/* ---- state.c --------------------------------------------------------------------------- */

/* Opens (creating if needed) the shared state file and claims a process slot.
 * Returns 0 on success; on error prints one line and returns -1. */
int gs_state_open(const struct gs_config *config);
/* Atomically reserve bytes on device if it keeps usage <= limit. 0: reserved, -1: refused. */
int gs_state_reserve(int device, uint64_t bytes, uint64_t limit);
void gs_state_release(int device, uint64_t bytes);
void gs_state_force(int device, uint64_t bytes);
uint64_t gs_state_used(int device);
/* Count one refused allocation in the state file (the monitor exports the count). */
void gs_state_count_refusal(void);
#define GS_MAX_PROCESSES 256 /* = the state file's slot count */
/* A process of the container: a live, published slot and what it is charged on a device. */
struct gs_state_process {
    uint32_t pid;
    uint64_t used;
};
/* The container's processes charged something on device, into out[0..max). Returns how many
 * there are (may exceed max; then only max were written). */
unsigned gs_state_processes(int device, struct gs_state_process *out, unsigned max);
struct gs_state_device;
/* The shared per-device record (NULL without a state file or for a bad index). */
struct gs_state_device *gs_state_device(int device);
/* Reclaim the slots of dead processes. Returns the number reclaimed. */
int gs_state_reclaim(void);
/* Release this process's slot (exit) / claim a fresh one (fork child). */
void gs_state_release_slot(void);
int gs_state_reclaim_slot_after_fork(void);

/* ---- accounting.c ---------------------------------------------------------------------- */

enum gs_kind { GS_KIND_PTR = 1, GS_KIND_ARRAY, GS_KIND_MIPMAP, GS_KIND_HANDLE, GS_KIND_CTX };

/* Initialise config + state once; returns 0 when allocations may proceed, otherwise the CUDA
 * error every hooked allocation must return. */
CUresult gs_init(void);
/* Limit for device (0: unlimited, no accounting). Requires gs_init() == 0. */
uint64_t gs_limit(int device);
/* Reserve before the real allocation. *charged is set to the bytes to record (0: untracked). */
CUresult gs_reserve(int device, uint64_t bytes, uint64_t *charged);
void gs_unreserve(int device, uint64_t charged);
/* Record an allocation's charge (no-op when charged == 0); -1 when out of host memory, in
 * which case the charge stays (conservative). */
int gs_remember(enum gs_kind kind, uint64_t key, int device, uint64_t charged);
/* Remove an allocation from the table without releasing its charge; -1 when unknown. */
int gs_take(enum gs_kind kind, uint64_t key, int *device, uint64_t *charged);
/* Adjust this process's primary-context reference count; returns the count before. */
int gs_primary_ref(int device, int delta);
/* Device of the current context, or -1. */
int gs_current_device(void);
uint64_t gs_ctx_overhead(void);
const struct gs_config *gs_get_config(void);

/* ---- pool.c: stream-ordered allocation, charged by what the pool reserves ---------------- */

typedef CUresult (*gs_alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*gs_alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*gs_free_async_fn)(CUdeviceptr, CUstream);

/* Exactly one of alloc / alloc_from_pool is non-NULL (pool is used with the latter). */
CUresult gs_pool_alloc(gs_alloc_async_fn alloc, gs_alloc_pool_fn alloc_from_pool,
                       gs_free_async_fn free_async, CUdeviceptr *pointer, size_t bytes,
                       CUmemoryPool pool, CUstream stream);
/* Remember which device a pool belongs to (from cuMemPoolCreate's location, or the device whose
 * default / current pool it is), so that allocations from it are charged there. */
void gs_pool_note_device(CUmemoryPool pool, int device);
/* The "device" of a pool in host memory (cuMemPoolCreate with a host / NUMA location): its
 * allocations pass through uncounted, like cuMemCreate's host allocations. */
#define GS_POOL_NOT_DEVICE (-2)
/* A destroyed pool: the driver gives its reservation back; so do we. */
void gs_pool_forget(CUmemoryPool pool);
/* Re-read every known pool's reservation and settle the charge (after frees and trims). */
void gs_pool_settle_all(void);
void gs_pool_fork_prepare(void);
void gs_pool_fork_parent(void);
void gs_pool_fork_child(void);

/* ---- limiter.c ------------------------------------------------------------------------- */

/* Called once from gs_init with the configured percent (0 = off). */
void gs_limiter_start(unsigned core_limit_percent);
/* Non-zero when launches must go through gs_limiter_charge. */
int gs_limiter_active(void);
/* What a launch is charged as: each kind has its own adaptive estimate of its GPU time. */
enum gs_launch_kind { GS_LAUNCH_KERNEL = 0, GS_LAUNCH_GRAPH = 1 };
/* Charge a launch on the current device; blocks while the device's bucket is empty. */
void gs_limiter_charge(enum gs_launch_kind kind);
/* In a fork child: the sampler thread did not survive; start it again on the next launch. */
void gs_limiter_fork_child(void);

#endif /* GPUSHARE_INTERNAL_H */
