/*
 * Stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync).
 *
 * A memory pool reserves device memory in chunks and keeps it after cuMemFreeAsync, so what
 * occupies the GPU is the pool's reservation, not the sum of live requests. When the driver
 * provides cuMemPoolGetAttribute we charge exactly that: each pool this process allocates from
 * has a process-local record of the reservation we have charged, and every pool operation
 * settles the record against CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT. Without the attribute we
 * fall back to charging each request like cuMemAlloc.
 *
 * Pool allocations are serialised within the process (one mutex) so that the before/after
 * reservation difference belongs to one call. The growth is reserved against the limit before
 * the real call (the part of the request the pool cannot serve from its free reservation);
 * if the pool grew by more (chunk rounding) the extra is reserved afterwards, and if that is
 * refused the allocation is undone (freed and the pool trimmed) and OUT_OF_MEMORY returned.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpushare.h"

#define GS_MAX_POOLS 64

typedef CUresult (*get_attr_fn)(CUmemoryPool, CUmemPool_attribute, void *);
typedef CUresult (*get_pool_fn)(CUmemoryPool *, CUdevice);
typedef CUresult (*trim_fn)(CUmemoryPool, size_t);

struct pool_record {
    CUmemoryPool pool;
    int device;
    uint64_t charged; /* reservation charged to the limit */
};

/* Which device a pool belongs to, as learnt from cuMemPoolCreate / cuDeviceGet(Default)MemPool
 * (the driver has no query for it). */
struct pool_home {
    CUmemoryPool pool;
    int device;
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool_record pools[GS_MAX_POOLS];
static int pool_count;
static struct pool_home homes[GS_MAX_POOLS];
static int home_count;

static int query(CUmemoryPool pool, CUmemPool_attribute attribute, uint64_t *value) {
    get_attr_fn get = (get_attr_fn)gs_real_cuda(GS_FN_cuMemPoolGetAttribute);
    cuuint64_t number = 0;
    if (get == NULL || get(pool, attribute, &number) != CUDA_SUCCESS) {
        return -1;
    }
    *value = number;
    return 0;
}

static struct pool_record *find_or_add(CUmemoryPool pool, int device) {
    for (int i = 0; i < pool_count; i++) {
        if (pools[i].pool == pool) {
            return &pools[i];
        }
    }
    if (pool_count == GS_MAX_POOLS) {
        return NULL;
    }
    struct pool_record *r = &pools[pool_count++];
    r->pool = pool;
    r->device = device;
    r->charged = 0;
    return r;
}

/* Bring the charge in line with the pool's current reservation. Caller holds pool_lock. */
static void settle(struct pool_record *r) {
    uint64_t reserved;
    if (query(r->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != 0) {
        return;
    }
    if (reserved > r->charged) {
        gs_state_force(r->device, reserved - r->charged);
    } else if (reserved < r->charged) {
        gs_unreserve(r->device, r->charged - reserved);
    }
    r->charged = reserved;
}

static void lock_pools(void) {
    if (pthread_mutex_lock(&pool_lock) != 0) {
        abort();
    }
}

static void unlock_pools(void) {
    if (pthread_mutex_unlock(&pool_lock) != 0) {
        abort();
    }
}

void gs_pool_settle_all(void) {
    lock_pools();
    for (int i = 0; i < pool_count; i++) {
        settle(&pools[i]);
    }
    unlock_pools();
}

void gs_pool_note_device(CUmemoryPool pool, int device) {
    if (pool == NULL || (device < 0 && device != GS_POOL_NOT_DEVICE)) {
        return;
    }
    lock_pools();
    int i = 0;
    while (i < home_count && homes[i].pool != pool) {
        i++;
    }
    if (i < GS_MAX_POOLS) { /* table full: that pool's device is found by the scan below */
        homes[i].pool = pool;
        homes[i].device = device;
        home_count = i == home_count ? home_count + 1 : home_count;
    }
    unlock_pools();
}

/* The driver releases a destroyed pool's reservation, so its charge goes back. (A pool destroyed
 * with blocks still allocated keeps them until they are freed; those bytes are then uncounted,
 * the price of not tracking every block.) The handle may be reused: forget its device too. */
void gs_pool_forget(CUmemoryPool pool) {
    lock_pools();
    for (int i = 0; i < home_count; i++) {
        if (homes[i].pool == pool) {
            homes[i] = homes[--home_count];
            break;
        }
    }
    for (int i = 0; i < pool_count; i++) {
        if (pools[i].pool == pool) {
            gs_unreserve(pools[i].device, pools[i].charged);
            pools[i] = pools[--pool_count];
            break;
        }
    }
    unlock_pools();
}

/* The recorded device (or GS_POOL_NOT_DEVICE); -1 when the pool is not recorded. */
static int recorded_device(CUmemoryPool pool) {
    int device = -1;
    lock_pools();
    for (int i = 0; i < home_count; i++) {
        if (homes[i].pool == pool) {
            device = homes[i].device;
            break;
        }
    }
    unlock_pools();
    return device;
}

static CUresult call_alloc(gs_alloc_async_fn alloc, gs_alloc_pool_fn alloc_from_pool,
                           CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool,
                           CUstream stream) {
    return alloc != NULL ? alloc(pointer, bytes, stream)
                         : alloc_from_pool(pointer, bytes, pool, stream);
}

/* The request-charging fallback (no pool attributes). */
static CUresult by_request(gs_alloc_async_fn alloc, gs_alloc_pool_fn alloc_from_pool, int device,
                           CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool,
                           CUstream stream) {
    uint64_t charged;
    CUresult rc = gs_reserve(device, bytes, &charged);
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    rc = call_alloc(alloc, alloc_from_pool, pointer, bytes, pool, stream);
    if (rc == CUDA_SUCCESS) {
        (void)gs_remember(GS_KIND_PTR, *pointer, device, charged);
    } else {
        gs_unreserve(device, charged);
    }
    return rc;
}

static CUmemoryPool current_pool(int device) {
    CUmemoryPool pool = NULL;
    get_pool_fn get = (get_pool_fn)gs_real_cuda(GS_FN_cuDeviceGetMemPool);
    if (get != NULL && get(&pool, device) == CUDA_SUCCESS && pool != NULL) {
        return pool;
    }
    get = (get_pool_fn)gs_real_cuda(GS_FN_cuDeviceGetDefaultMemPool);
    if (get != NULL && get(&pool, device) == CUDA_SUCCESS) {
        return pool;
    }
    return NULL;
}

/* The device a pool belongs to: recorded when the program created or looked the pool up, else
 * the device whose current or default pool it is (a handle obtained some other way); -1 when
 * neither tells, and the caller falls back to the current context's device. */
static int pool_device(CUmemoryPool pool) {
    int recorded = recorded_device(pool);
    if (recorded != -1) {
        return recorded;
    }
    get_pool_fn get_current = (get_pool_fn)gs_real_cuda(GS_FN_cuDeviceGetMemPool);
    get_pool_fn get_default = (get_pool_fn)gs_real_cuda(GS_FN_cuDeviceGetDefaultMemPool);
    for (int device = 0; device < GS_MAX_DEVICES && get_default != NULL; device++) {
        CUmemoryPool candidate = NULL;
        if (get_default(&candidate, device) != CUDA_SUCCESS) {
            break; /* no such device */
        }
        if (candidate == pool) {
            return device;
        }
        candidate = NULL;
        if (get_current != NULL && get_current(&candidate, device) == CUDA_SUCCESS &&
            candidate == pool) {
            return device;
        }
    }
    return -1;
}

/* The device of a context other than the current one. The driver has no query for it, so the
 * context is made current on this thread for one cuCtxGetDevice and the caller's context is
 * restored; no other thread can observe the switch. -1 when that fails. */
static int context_device(CUcontext context, CUcontext current) {
    typedef CUresult (*set_fn)(CUcontext);
    set_fn set = (set_fn)gs_real_cuda(GS_FN_cuCtxSetCurrent);
    if (set == NULL || set(context) != CUDA_SUCCESS) {
        return -1;
    }
    int device = gs_current_device();
    if (set(current) != CUDA_SUCCESS) {
        /* Cannot happen for a context that was current a moment ago; nothing to do but say so. */
        (void)fprintf(stderr, "gpushare: could not restore the current CUDA context\n");
    }
    return device;
}

/* The device of the context a stream belongs to (cuMemAllocAsync allocates from that device's
 * current pool). The default streams mean the current context. Unknown: the current device. */
#define GS_STREAM_LEGACY ((CUstream)0x1)
#define GS_STREAM_PER_THREAD ((CUstream)0x2)

static int stream_device(CUstream stream) {
    if (stream == NULL || stream == GS_STREAM_LEGACY || stream == GS_STREAM_PER_THREAD) {
        return gs_current_device();
    }
    typedef CUresult (*get_ctx_fn)(CUstream, CUcontext *);
    typedef CUresult (*current_fn)(CUcontext *);
    get_ctx_fn get_ctx = (get_ctx_fn)gs_real_cuda(GS_FN_cuStreamGetCtx);
    current_fn get_current = (current_fn)gs_real_cuda(GS_FN_cuCtxGetCurrent);
    CUcontext owner = NULL, current = NULL;
    if (get_ctx == NULL || get_current == NULL || get_ctx(stream, &owner) != CUDA_SUCCESS ||
        get_current(&current) != CUDA_SUCCESS || owner == NULL || owner == current) {
        return gs_current_device();
    }
    int device = context_device(owner, current);
    return device >= 0 ? device : gs_current_device();
}

CUresult gs_pool_alloc(gs_alloc_async_fn alloc, gs_alloc_pool_fn alloc_from_pool,
                       gs_free_async_fn free_async, CUdeviceptr *pointer, size_t bytes,
                       CUmemoryPool pool, CUstream stream) {
    if ((alloc == NULL && alloc_from_pool == NULL) || free_async == NULL) {
        return CUDA_ERROR_NOT_FOUND;
    }
    CUresult rc = gs_init();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    int device = alloc_from_pool != NULL && pool != NULL ? pool_device(pool)
                                                         : stream_device(stream);
    if (device == -1) {
        device = gs_current_device();
    }
    /* gs_limit is 0 for GS_POOL_NOT_DEVICE too: a host pool passes through. */
    if (gs_limit(device) == 0 || bytes == 0 || pointer == NULL) {
        return call_alloc(alloc, alloc_from_pool, pointer, bytes, pool, stream);
    }
    CUmemoryPool target = alloc != NULL ? current_pool(device) : pool;
    uint64_t probe;
    if (target == NULL || query(target, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &probe) != 0) {
        return by_request(alloc, alloc_from_pool, device, pointer, bytes, pool, stream);
    }
    lock_pools();
    struct pool_record *r = find_or_add(target, device);
    if (r == NULL) {
        unlock_pools();
        return by_request(alloc, alloc_from_pool, device, pointer, bytes, pool, stream);
    }
    settle(r);
    uint64_t before = r->charged, used = 0;
    if (query(target, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != 0) {
        used = before;
    }
    uint64_t spare = before > used ? before - used : 0;
    uint64_t pre = 0;
    if (bytes > spare) {
        rc = gs_reserve(r->device, bytes - spare, &pre);
        if (rc != CUDA_SUCCESS) {
            unlock_pools();
            return rc;
        }
    }
    rc = call_alloc(alloc, alloc_from_pool, pointer, bytes, pool, stream);
    uint64_t after;
    if (query(target, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &after) != 0) {
        after = before + (rc == CUDA_SUCCESS ? pre : 0);
    }
    uint64_t growth = after > before ? after - before : 0;
    if (growth <= pre) {
        gs_unreserve(r->device, pre - growth);
        r->charged = before + growth;
    } else {
        uint64_t extra = 0;
        CUresult more = gs_reserve(r->device, growth - pre, &extra);
        if (more != CUDA_SUCCESS && rc == CUDA_SUCCESS) {
            /* Undo: return the block to the pool and give the new reservation back. */
            (void)free_async(*pointer, stream);
            trim_fn trim = (trim_fn)gs_real_cuda(GS_FN_cuMemPoolTrimTo);
            if (trim != NULL) {
                (void)trim(target, (size_t)before);
            }
            gs_unreserve(r->device, pre);
            r->charged = before;
            settle(r);
            unlock_pools();
            return more;
        }
        r->charged = before + pre + extra;
        settle(r);
    }
    unlock_pools();
    return rc;
}

void gs_pool_fork_prepare(void) { lock_pools(); }

void gs_pool_fork_parent(void) { unlock_pools(); }

/* The child's pools are copies whose reservations the parent's slot pays for: start afresh. */
void gs_pool_fork_child(void) {
    pool_count = 0;
    home_count = 0;
    unlock_pools();
}
