/*
 * Mock CUDA driver: virtual memory management allocations (cuMemCreate/cuMemRelease). A device
 * location is charged to that device; host locations succeed without using device memory.
 */
#include "cuda_internal.h"

MOCK_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                   const CUmemAllocationProp *prop,
                                                   CUmemAllocationGranularity_flags option)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!granularity || !prop || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                  option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = MOCK_VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle || !prop || bytes == 0 || flags != 0 || bytes % MOCK_VMM_GRANULARITY != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    int device = -1;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!mock_valid_device(prop->location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        device = prop->location.id;
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    if (device >= 0)
        rc = mock_charge(device, bytes);
    if (rc == CUDA_SUCCESS) {
        struct mock_alloc alloc = {
            .address = mock_next_address(bytes),
            .bytes = device >= 0 ? bytes : 0,
            .requested = bytes,
            .device = device >= 0 ? device : 0,
            .kind = MOCK_ALLOC_VMM,
        };
        rc = mock_alloc_insert(&alloc);
        if (rc == CUDA_SUCCESS)
            *handle = (CUmemGenericAllocationHandle)alloc.address;
        else if (device >= 0)
            mock_uncharge(device, bytes);
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (handle == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_alloc *alloc = mock_alloc_find(handle);
    if (!alloc || alloc->kind != MOCK_ALLOC_VMM) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        mock_uncharge(alloc->device, alloc->bytes);
        mock_alloc_erase(handle);
    }
    mock_cuda_unlock();
    return rc;
}
