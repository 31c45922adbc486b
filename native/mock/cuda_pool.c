/*
 * Mock CUDA driver: stream-ordered allocation from memory pools: each device's default pool and
 * pools made with cuMemPoolCreate; cuDeviceSetMemPool chooses the pool cuMemAllocAsync uses.
 *
 * A pool reserves device memory in 2 MiB chunks (that is what is charged to the device) and
 * keeps freed memory reserved until cuMemPoolTrimTo releases it.
 */
#include "cuda_internal.h"

#include <stdlib.h>

static struct mock_pool g_pools[MOCK_MAX_DEVICES];
static struct mock_pool *g_current[MOCK_MAX_DEVICES]; /* cuDeviceSetMemPool; NULL: default */

void mock_pools_init(void)
{
    for (int i = 0; i < MOCK_MAX_DEVICES; i++)
        g_pools[i].device = i;
}

/* A default or created pool (lock held), or NULL. */
static struct mock_pool *pool_from_handle(CUmemoryPool handle)
{
    for (int i = 0; i < mock_cfg()->device_count; i++)
        if ((CUmemoryPool)&g_pools[i] == handle)
            return &g_pools[i];
    if (handle && mock_handle_live(handle, MOCK_HANDLE_POOL))
        return (struct mock_pool *)handle;
    return NULL;
}

static struct mock_pool *current_pool_locked(int device)
{
    return g_current[device] ? g_current[device] : &g_pools[device];
}

static uint64_t round_chunk(uint64_t bytes)
{
    return (bytes + MOCK_POOL_CHUNK - 1) / MOCK_POOL_CHUNK * MOCK_POOL_CHUNK;
}

MOCK_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = (CUmemoryPool)&g_pools[device];
    return CUDA_SUCCESS;
}

static CUresult pool_alloc_locked(struct mock_pool *pool, CUdeviceptr *pointer, uint64_t bytes)
{
    if (bytes > UINT64_MAX - MOCK_POOL_CHUNK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t available = pool->reserved - pool->used;
    uint64_t grow = bytes > available ? round_chunk(bytes - available) : 0;
    if (grow > 0) {
        CUresult rc = mock_charge(pool->device, grow);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    struct mock_alloc alloc = {
        .address = mock_next_address(bytes),
        .requested = bytes,
        .device = pool->device,
        .kind = MOCK_ALLOC_POOL,
        .pool = pool,
    };
    CUresult rc = mock_alloc_insert(&alloc);
    if (rc != CUDA_SUCCESS) {
        mock_uncharge(pool->device, grow);
        return rc;
    }
    pool->reserved += grow;
    pool->used += bytes;
    if (pool->reserved > pool->reserved_high)
        pool->reserved_high = pool->reserved;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
    *pointer = (CUdeviceptr)alloc.address;
    return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *pointer, size_t bytes, CUmemoryPool handle,
                            bool default_pool, CUstream stream)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pointer || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    rc = mock_stream_resolve_locked(stream, &context, &resolved);
    if (rc == CUDA_SUCCESS) {
        struct mock_pool *pool = default_pool ? current_pool_locked(context->device)
                                              : pool_from_handle(handle);
        rc = pool ? pool_alloc_locked(pool, pointer, bytes) : CUDA_ERROR_INVALID_VALUE;
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *pointer, size_t bytes, CUstream stream)
{
    return alloc_async(pointer, bytes, NULL, true, stream);
}

MOCK_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *pointer, size_t bytes, CUstream stream)
{
    return alloc_async(pointer, bytes, NULL, true, stream);
}

MOCK_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *pointer, size_t bytes,
                                             CUmemoryPool pool, CUstream stream)
{
    return alloc_async(pointer, bytes, pool, false, stream);
}

MOCK_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *pointer, size_t bytes,
                                                  CUmemoryPool pool, CUstream stream)
{
    return alloc_async(pointer, bytes, pool, false, stream);
}

static CUresult free_async(CUdeviceptr pointer, CUstream stream)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (pointer == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    rc = mock_stream_resolve_locked(stream, &context, &resolved);
    if (rc == CUDA_SUCCESS) {
        struct mock_alloc *alloc = mock_alloc_find(pointer);
        if (!alloc || alloc->kind != MOCK_ALLOC_POOL) {
            rc = CUDA_ERROR_INVALID_VALUE;
        } else {
            alloc->pool->used -= alloc->requested; /* stays reserved in the pool */
            mock_alloc_erase(pointer);
        }
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream)
{
    return free_async(pointer, stream);
}

MOCK_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr pointer, CUstream stream)
{
    return free_async(pointer, stream);
}

MOCK_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool handle, size_t min_bytes_to_keep)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_pool *pool = pool_from_handle(handle);
    if (!pool) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        uint64_t keep = round_chunk(pool->used);
        uint64_t asked = min_bytes_to_keep > UINT64_MAX - MOCK_POOL_CHUNK
                             ? UINT64_MAX
                             : round_chunk(min_bytes_to_keep);
        if (asked > keep)
            keep = asked;
        if (keep < pool->reserved) {
            mock_uncharge(pool->device, pool->reserved - keep);
            pool->reserved = keep;
        }
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool handle, CUmemPool_attribute attribute,
                                           void *value)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    const struct mock_pool *pool = pool_from_handle(handle);
    cuuint64_t number = 0;
    bool is_int = false;
    if (!pool) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attribute) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            is_int = true;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            number = 0;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            number = pool->reserved;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            number = pool->reserved_high;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            number = pool->used;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            number = pool->used_high;
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    mock_cuda_unlock();
    if (rc == CUDA_SUCCESS) {
        if (is_int)
            *(int *)value = 1;
        else
            *(cuuint64_t *)value = number;
    }
    return rc;
}

/* Device-located pinned pools only; other locations and handle types are not mocked. */
MOCK_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *out, const CUmemPoolProps *props)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!mock_valid_device(props->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    struct mock_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pool->device = props->location.id;
    if (mock_cuda_lock() != 0) {
        free(pool);
        return CUDA_ERROR_UNKNOWN;
    }
    rc = mock_handle_add(pool, MOCK_HANDLE_POOL);
    mock_cuda_unlock();
    if (rc != CUDA_SUCCESS) {
        free(pool);
        return rc;
    }
    *out = (CUmemoryPool)pool;
    return CUDA_SUCCESS;
}

/* The real driver defers destroying a pool with live blocks; the mock refuses (ILLEGAL_STATE) so
 * that no block outlives its pool. The reservation goes back to the device. */
MOCK_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool handle)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_pool *pool = handle && mock_handle_live(handle, MOCK_HANDLE_POOL)
                                 ? (struct mock_pool *)handle
                                 : NULL;
    if (!pool) {
        rc = CUDA_ERROR_INVALID_VALUE; /* unknown, or a default pool */
    } else if (pool->used > 0) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        mock_uncharge(pool->device, pool->reserved);
        if (g_current[pool->device] == pool)
            g_current[pool->device] = NULL;
        mock_handle_remove(pool);
        free(pool);
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *out, CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    *out = (CUmemoryPool)current_pool_locked(device);
    mock_cuda_unlock();
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool handle)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_pool *pool = pool_from_handle(handle);
    if (!pool || pool->device != device)
        rc = CUDA_ERROR_INVALID_VALUE; /* a pool of another device cannot be its current pool */
    else
        g_current[device] = pool == &g_pools[device] ? NULL : pool;
    mock_cuda_unlock();
    return rc;
}
