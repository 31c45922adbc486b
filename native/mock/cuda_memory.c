/* Mock CUDA driver: linear device memory (cuMemAlloc and friends) and cuMemGetInfo. */
#include "cuda_internal.h"

MOCK_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = mock_current_context_locked();
    int device = context ? context->device : -1;
    mock_cuda_unlock();
    if (!context)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (mock_shared_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    uint64_t used = mock_device_used_locked(device);
    mock_shared_unlock();
    uint64_t total = mock_cfg()->devices[device].memory_bytes;
    *total_bytes = (size_t)total;
    *free_bytes = (size_t)(used < total ? total - used : 0);
    return CUDA_SUCCESS;
}

CUresult mock_linear_alloc_locked(CUdeviceptr *pointer, uint64_t bytes, enum mock_alloc_kind kind)
{
    struct mock_context *context = mock_current_context_locked();
    if (!context)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = mock_charge(context->device, bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct mock_alloc alloc = {
        .address = mock_next_address(bytes),
        .bytes = bytes,
        .requested = bytes,
        .device = context->device,
        .kind = kind,
        .context = context,
    };
    rc = mock_alloc_insert(&alloc);
    if (rc != CUDA_SUCCESS) {
        mock_uncharge(context->device, bytes);
        return rc;
    }
    *pointer = (CUdeviceptr)alloc.address;
    return CUDA_SUCCESS;
}

CUresult mock_free_locked(uint64_t address, enum mock_alloc_kind kind)
{
    struct mock_alloc *alloc = mock_alloc_find(address);
    if (!alloc || alloc->kind != kind)
        return kind == MOCK_ALLOC_LINEAR ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    mock_uncharge(alloc->device, alloc->bytes);
    mock_alloc_erase(address);
    return CUDA_SUCCESS;
}

static CUresult linear_alloc(CUdeviceptr *pointer, uint64_t bytes)
{
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    CUresult rc = mock_linear_alloc_locked(pointer, bytes, MOCK_ALLOC_LINEAR);
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pointer || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return linear_alloc(pointer, bytes);
}

MOCK_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *pointer, size_t *pitch, size_t width_bytes,
                                        size_t height, unsigned int element_size_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pointer || !pitch || width_bytes == 0 || height == 0 ||
        (element_size_bytes != 4 && element_size_bytes != 8 && element_size_bytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (width_bytes > SIZE_MAX - MOCK_PITCH_ALIGNMENT)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t rounded = (width_bytes + MOCK_PITCH_ALIGNMENT - 1) / MOCK_PITCH_ALIGNMENT *
                     MOCK_PITCH_ALIGNMENT;
    if (height > SIZE_MAX / rounded)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = linear_alloc(pointer, (uint64_t)rounded * height);
    if (rc == CUDA_SUCCESS)
        *pitch = rounded;
    return rc;
}

MOCK_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *pointer, size_t bytes, unsigned int flags)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pointer || bytes == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    /* Charged to the device in full, as if every page had migrated there. */
    return linear_alloc(pointer, bytes);
}

MOCK_EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (pointer == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    if (!mock_current_context_locked())
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else
        rc = mock_free_locked(pointer, MOCK_ALLOC_LINEAR);
    mock_cuda_unlock();
    return rc;
}
