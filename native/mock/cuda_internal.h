/*
 * Process-local state of the mock CUDA driver, shared by the mock/cuda_*.c files.
 *
 * One mutex (mock_cuda_lock) guards everything here; code that also needs the cross-process
 * lock takes it second (mock_cuda_lock, then mock_shared_lock).
 */
#ifndef GPUSHARE_MOCK_CUDA_INTERNAL_H
#define GPUSHARE_MOCK_CUDA_INTERNAL_H

#include "gpushare/driver_types.h"
#include "mock.h"

#define MOCK_PITCH_ALIGNMENT 512u
#define MOCK_VMM_GRANULARITY (2u * 1024u * 1024u)
#define MOCK_POOL_CHUNK (2u * 1024u * 1024u)

#define MOCK_STREAM_LEGACY ((CUstream)0x1)
#define MOCK_STREAM_PER_THREAD ((CUstream)0x2)

enum mock_handle_type {
    MOCK_HANDLE_CONTEXT = 1,
    MOCK_HANDLE_STREAM,
    MOCK_HANDLE_GRAPH,
    MOCK_HANDLE_GRAPH_EXEC,
    MOCK_HANDLE_POOL, /* a pool from cuMemPoolCreate */
};

struct mock_context {
    int device;
    bool primary;
    bool active;             /* a primary context is inactive while its refcount is 0 */
    unsigned int refcount;   /* primary contexts only */
    _Atomic uint64_t last_end_ns;
};

struct mock_stream {
    struct mock_context *context;
    _Atomic uint64_t last_end_ns;
};

struct mock_graph {
    unsigned int kernels;
};

struct mock_pool {
    int device;
    uint64_t reserved;
    uint64_t used;
    uint64_t reserved_high;
    uint64_t used_high;
};

enum mock_alloc_kind {
    MOCK_ALLOC_LINEAR = 1, /* cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged */
    MOCK_ALLOC_POOL,
    MOCK_ALLOC_VMM,
    MOCK_ALLOC_ARRAY,
    MOCK_ALLOC_MIPMAP,
};

struct mock_alloc {
    uint64_t address;
    uint64_t bytes;           /* bytes charged to the device (0 for host VMM allocations) */
    uint64_t requested;
    int device;
    enum mock_alloc_kind kind;
    struct mock_context *context; /* owner for context-bound kinds, else NULL */
    struct mock_pool *pool;
    struct mock_alloc *next;
};

/* cuda_core.c */
int mock_cuda_lock(void);
void mock_cuda_unlock(void);
CUresult mock_check_init(void);                /* NOT_INITIALIZED before a successful cuInit */
bool mock_valid_device(CUdevice device);
/* Registry of live handles, so that a stale handle is an error instead of a use-after-free. */
CUresult mock_handle_add(void *handle, enum mock_handle_type type);
bool mock_handle_live(const void *handle, enum mock_handle_type type);
void mock_handle_remove(const void *handle);
/* Allocation table, keyed by device address. */
uint64_t mock_next_address(uint64_t bytes);
/* An address below 4 GiB for the legacy 32-bit entry points; 0 once that range is used up. */
uint64_t mock_next_low_address(uint64_t bytes);
CUresult mock_alloc_insert(const struct mock_alloc *alloc);
struct mock_alloc *mock_alloc_find(uint64_t address);
void mock_alloc_erase(uint64_t address);
/* Frees (and uncharges) every allocation owned by the context; shared lock must be held. */
void mock_alloc_free_context_locked(const struct mock_context *context);
/* Charges bytes on the device under the shared lock; CUDA_ERROR_OUT_OF_MEMORY if they do not fit. */
CUresult mock_charge(int device, uint64_t bytes);
void mock_uncharge(int device, uint64_t bytes);

/* cuda_context.c: the calling thread's current context if live and active, else NULL (lock held). */
struct mock_context *mock_current_context_locked(void);
struct mock_context *mock_primary_context(int device);

/* cuda_memory.c: allocate/free a linear, context-bound allocation (lock held). */
CUresult mock_linear_alloc_locked(CUdeviceptr *pointer, uint64_t bytes, enum mock_alloc_kind kind);
/* The same below 4 GiB (legacy entry points); CUDA_ERROR_OUT_OF_MEMORY when that range is full. */
CUresult mock_linear_alloc_low_locked(CUdeviceptr *pointer, uint64_t bytes,
                                      enum mock_alloc_kind kind);
/* Free and total memory of the current context's device (the cuMemGetInfo_v2 answer). */
CUresult mock_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);
CUresult mock_free_locked(uint64_t address, enum mock_alloc_kind kind);

/* cuda_pool.c */
void mock_pools_init(void);

/*
 * cuda_launch.c: resolves a stream argument (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a
 * stream from cuStreamCreate) to its context (the current one for the default streams) and, for
 * a created stream, the stream itself. Lock held.
 */
CUresult mock_stream_resolve_locked(CUstream stream, struct mock_context **context,
                                    struct mock_stream **resolved);

#endif /* GPUSHARE_MOCK_CUDA_INTERNAL_H */
