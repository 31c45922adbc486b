/* Mock CUDA driver: linear device memory (cuMemAlloc and friends) and cuMemGetInfo. */
#include "cuda_internal.h"

/* Not through the exported entry points: inside the mock those would bind to an interposer's. */
CUresult mock_mem_info(uint64_t *free_bytes, uint64_t *total_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
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
    *total_bytes = total;
    *free_bytes = used < total ? total - used : 0;
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t free64 = 0, total64 = 0;
    rc = mock_mem_info(&free64, &total64);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = (size_t)free64;
        *total_bytes = (size_t)total64;
    }
    return rc;
}

static CUresult linear_alloc_at_locked(CUdeviceptr *pointer, uint64_t bytes,
                                       enum mock_alloc_kind kind, bool low)
{
    struct mock_context *context = mock_current_context_locked();
    if (!context)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = mock_charge(context->device, bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t address = low ? mock_next_low_address(bytes) : mock_next_address(bytes);
    if (address == 0) {
        mock_uncharge(context->device, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY; /* no 32-bit address left */
    }
    struct mock_alloc alloc = {
        .address = address,
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

CUresult mock_linear_alloc_locked(CUdeviceptr *pointer, uint64_t bytes, enum mock_alloc_kind kind)
{
    return linear_alloc_at_locked(pointer, bytes, kind, false);
}

CUresult mock_linear_alloc_low_locked(CUdeviceptr *pointer, uint64_t bytes,
                                      enum mock_alloc_kind kind)
{
    return linear_alloc_at_locked(pointer, bytes, kind, true);
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

static CUresult linear_alloc_at(CUdeviceptr *pointer, uint64_t bytes, bool low)
{
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    CUresult rc = linear_alloc_at_locked(pointer, bytes, MOCK_ALLOC_LINEAR, low);
    mock_cuda_unlock();
    return rc;
}

static CUresult linear_alloc(CUdeviceptr *pointer, uint64_t bytes)
{
    return linear_alloc_at(pointer, bytes, false);
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

/* The pitch (width rounded up to 512) and its size; false when the arguments are invalid. */
static bool pitch_size(uint64_t width_bytes, uint64_t height, unsigned int element_size_bytes,
                       uint64_t *pitch, uint64_t *bytes)
{
    if (width_bytes == 0 || height == 0 ||
        (element_size_bytes != 4 && element_size_bytes != 8 && element_size_bytes != 16))
        return false;
    if (width_bytes > UINT64_MAX - MOCK_PITCH_ALIGNMENT)
        return false;
    *pitch = (width_bytes + MOCK_PITCH_ALIGNMENT - 1) / MOCK_PITCH_ALIGNMENT *
             MOCK_PITCH_ALIGNMENT;
    return !__builtin_mul_overflow(*pitch, height, bytes);
}

MOCK_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *pointer, size_t *pitch, size_t width_bytes,
                                        size_t height, unsigned int element_size_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t rounded = 0, bytes = 0;
    if (!pointer || !pitch || width_bytes == 0 || height == 0 ||
        (element_size_bytes != 4 && element_size_bytes != 8 && element_size_bytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (!pitch_size(width_bytes, height, element_size_bytes, &rounded, &bytes))
        return CUDA_ERROR_OUT_OF_MEMORY; /* too large to address */
    rc = linear_alloc(pointer, bytes);
    if (rc == CUDA_SUCCESS)
        *pitch = (size_t)rounded;
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

/* Both cuMemFree entry points; a static function, so that the legacy one does not go through
 * an exported symbol the interception library may have replaced. */
static CUresult linear_free(CUdeviceptr pointer)
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

MOCK_EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer)
{
    return linear_free(pointer);
}

/* ---- legacy (pre-_v2) entry points: 32-bit device pointers and sizes ---------------------- */

/* The allocation is placed below 4 GiB so that its address fits the 32-bit pointer. */
MOCK_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *pointer, unsigned int bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pointer || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr wide = 0;
    rc = linear_alloc_at(&wide, bytes, true);
    if (rc == CUDA_SUCCESS)
        *pointer = (CUdeviceptr_v1)wide;
    return rc;
}

MOCK_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *pointer, unsigned int *pitch,
                                     unsigned int width_bytes, unsigned int height,
                                     unsigned int element_size_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t rounded = 0, bytes = 0;
    /* A pitch that does not fit the 32-bit output cannot be returned. */
    if (!pointer || !pitch ||
        !pitch_size(width_bytes, height, element_size_bytes, &rounded, &bytes) ||
        rounded > UINT32_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr wide = 0;
    rc = linear_alloc_at(&wide, bytes, true);
    if (rc == CUDA_SUCCESS) {
        *pointer = (CUdeviceptr_v1)wide;
        *pitch = (unsigned int)rounded;
    }
    return rc;
}

MOCK_EXPORT CUresult cuMemFree(CUdeviceptr_v1 pointer)
{
    return linear_free(pointer);
}

/* Like the real driver, sizes that do not fit 32 bits are reported as UINT_MAX. */
MOCK_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t free64 = 0, total64 = 0;
    rc = mock_mem_info(&free64, &total64);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = free64 > UINT32_MAX ? UINT32_MAX : (unsigned int)free64;
        *total_bytes = total64 > UINT32_MAX ? UINT32_MAX : (unsigned int)total64;
    }
    return rc;
}
