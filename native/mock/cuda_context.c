/*
 * Mock CUDA driver: contexts. Each context, primary or not, charges its device's
 * context_overhead_mib while it exists; destroying it (or releasing a primary context to a
 * reference count of 0) frees the allocations made in it.
 */
#include "cuda_internal.h"

#include <stdlib.h>

static _Thread_local struct mock_context *tls_current;
static struct mock_context g_primary[MOCK_MAX_DEVICES];
static bool g_primary_registered[MOCK_MAX_DEVICES];

struct mock_context *mock_current_context_locked(void)
{
    struct mock_context *context = tls_current;
    if (!context || !mock_handle_live(context, MOCK_HANDLE_CONTEXT) || !context->active)
        return NULL;
    return context;
}

struct mock_context *mock_primary_context(int device)
{
    return &g_primary[device];
}

/* Charges the overhead of a new context and counts it; shared lock taken here. */
static CUresult context_open(int device)
{
    if (mock_shared_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    bool fits = mock_charge_locked(device, mock_cfg()->devices[device].context_overhead_bytes);
    if (fits)
        mock_contexts_add_locked(device, 1);
    mock_shared_unlock();
    return fits ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static void context_close(struct mock_context *context)
{
    if (mock_shared_lock() != 0)
        return;
    mock_alloc_free_context_locked(context);
    mock_uncharge_locked(context->device, mock_cfg()->devices[context->device].context_overhead_bytes);
    mock_contexts_add_locked(context->device, -1);
    mock_shared_unlock();
}

/* Every cuCtxCreate version; flags and execution affinity are accepted and ignored. */
static CUresult context_create(CUcontext *out, CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    struct mock_context *context = calloc(1, sizeof *context);
    if (!context)
        return CUDA_ERROR_OUT_OF_MEMORY;
    context->device = device;
    context->active = true;
    if (mock_cuda_lock() != 0) {
        free(context);
        return CUDA_ERROR_UNKNOWN;
    }
    rc = context_open(device);
    if (rc == CUDA_SUCCESS) {
        rc = mock_handle_add(context, MOCK_HANDLE_CONTEXT);
        if (rc != CUDA_SUCCESS)
            context_close(context);
    }
    if (rc == CUDA_SUCCESS) {
        tls_current = context;
        *out = (CUcontext)context;
    } else {
        free(context);
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuCtxCreate_v2(CUcontext *out, unsigned int flags, CUdevice device)
{
    (void)flags;
    return context_create(out, device);
}

MOCK_EXPORT CUresult cuCtxCreate(CUcontext *out, unsigned int flags, CUdevice device)
{
    (void)flags;
    return context_create(out, device);
}

/* Affinity parameters are checked for shape only (an SM count of at least 1). */
static bool affinity_valid(const CUexecAffinityParam *params, int count)
{
    if (count < 0 || (count > 0 && !params))
        return false;
    for (int i = 0; i < count; i++)
        if (params[i].type != CU_EXEC_AFFINITY_TYPE_SM_COUNT || params[i].param.smCount.val == 0)
            return false;
    return true;
}

MOCK_EXPORT CUresult cuCtxCreate_v3(CUcontext *out, CUexecAffinityParam *params, int count,
                                    unsigned int flags, CUdevice device)
{
    (void)flags;
    if (mock_check_init() == CUDA_SUCCESS && !affinity_valid(params, count))
        return CUDA_ERROR_INVALID_VALUE;
    return context_create(out, device);
}

MOCK_EXPORT CUresult cuCtxCreate_v4(CUcontext *out, CUctxCreateParams *params, unsigned int flags,
                                    CUdevice device)
{
    (void)flags;
    if (mock_check_init() == CUDA_SUCCESS && params &&
        !affinity_valid(params->execAffinityParams, params->numExecAffinityParams))
        return CUDA_ERROR_INVALID_VALUE;
    return context_create(out, device);
}

/* Shared by cuCtxDestroy_v2 and the legacy cuCtxDestroy. */
static CUresult context_destroy(CUcontext handle)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = (struct mock_context *)handle;
    if (!mock_handle_live(context, MOCK_HANDLE_CONTEXT) || context->primary) {
        mock_cuda_unlock();
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    context_close(context);
    mock_handle_remove(context);
    if (tls_current == context)
        tls_current = NULL;
    free(context);
    mock_cuda_unlock();
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuCtxDestroy_v2(CUcontext handle)
{
    return context_destroy(handle);
}

MOCK_EXPORT CUresult cuCtxDestroy(CUcontext handle)
{
    return context_destroy(handle);
}

/* The context a stream belongs to; the default streams give the current context. */
MOCK_EXPORT CUresult cuStreamGetCtx(CUstream stream, CUcontext *out)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    rc = mock_stream_resolve_locked(stream, &context, &resolved);
    if (rc == CUDA_SUCCESS)
        *out = (CUcontext)context;
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuCtxSetCurrent(CUcontext handle)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle) {
        tls_current = NULL;
        return CUDA_SUCCESS;
    }
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    bool live = mock_handle_live(handle, MOCK_HANDLE_CONTEXT);
    if (live)
        tls_current = (struct mock_context *)handle;
    mock_cuda_unlock();
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

MOCK_EXPORT CUresult cuCtxGetCurrent(CUcontext *out)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = tls_current;
    *out = mock_handle_live(context, MOCK_HANDLE_CONTEXT) ? (CUcontext)context : NULL;
    mock_cuda_unlock();
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = mock_current_context_locked();
    if (context)
        *device = context->device;
    mock_cuda_unlock();
    return context ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

MOCK_EXPORT CUresult cuCtxSynchronize(void)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = mock_current_context_locked();
    uint64_t deadline = context ? atomic_load(&context->last_end_ns) : 0;
    mock_cuda_unlock();
    if (!context)
        return CUDA_ERROR_INVALID_CONTEXT;
    mock_sleep_until_ns(deadline);
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *out, CUdevice device)
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
    struct mock_context *context = &g_primary[device];
    if (!g_primary_registered[device]) {
        rc = mock_handle_add(context, MOCK_HANDLE_CONTEXT);
        if (rc == CUDA_SUCCESS) {
            g_primary_registered[device] = true;
            context->device = device;
            context->primary = true;
        }
    }
    if (rc == CUDA_SUCCESS && context->refcount == 0) {
        rc = context_open(device);
        if (rc == CUDA_SUCCESS)
            context->active = true;
    }
    if (rc == CUDA_SUCCESS) {
        context->refcount++;
        *out = (CUcontext)context;
    }
    mock_cuda_unlock();
    return rc;
}

static CUresult primary_release(CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = &g_primary[device];
    if (context->refcount == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--context->refcount == 0) {
        context->active = false;
        context_close(context);
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device)
{
    return primary_release(device);
}

MOCK_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice device)
{
    return primary_release(device);
}
