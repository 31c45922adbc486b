/*
 * Mock CUDA driver: CUDA arrays and mipmapped arrays. An array is charged
 * width * max(height, 1) * max(depth, 1) * channels * element size; a mipmapped array the sum
 * over its levels, each level halving every dimension (down to 1).
 */
#include "cuda_internal.h"

static unsigned int format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 0;
    }
}

/* Bytes of one array level; false when the descriptor is invalid or the size overflows. */
static bool level_bytes(size_t width, size_t height, size_t depth, CUarray_format format,
                        unsigned int channels, uint64_t *bytes)
{
    unsigned int element = format_bytes(format);
    if (width == 0 || element == 0 || (channels != 1 && channels != 2 && channels != 4))
        return false;
    uint64_t total = width;
    if (__builtin_mul_overflow(total, (uint64_t)(height ? height : 1), &total) ||
        __builtin_mul_overflow(total, (uint64_t)(depth ? depth : 1), &total) ||
        __builtin_mul_overflow(total, (uint64_t)channels * element, &total))
        return false;
    *bytes = total;
    return true;
}

static CUresult create(uint64_t *handle, uint64_t bytes, enum mock_alloc_kind kind)
{
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    CUdeviceptr address = 0;
    CUresult rc = mock_linear_alloc_locked(&address, bytes, kind);
    mock_cuda_unlock();
    if (rc == CUDA_SUCCESS)
        *handle = address;
    return rc;
}

static CUresult destroy(uint64_t handle, enum mock_alloc_kind kind)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (handle == 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    rc = mock_free_locked(handle, kind);
    mock_cuda_unlock();
    return rc;
}

/* One array of the given shape (depth 0 for a 2D array), whichever descriptor described it. */
static CUresult create_array(CUarray *array, int described, size_t width, size_t height,
                             size_t depth, CUarray_format format, unsigned int channels)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t bytes = 0, handle = 0;
    if (!array || !described || !level_bytes(width, height, depth, format, channels, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    rc = create(&handle, bytes, MOCK_ALLOC_ARRAY);
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)handle;
    return rc;
}

MOCK_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *d)
{
    return d ? create_array(array, 1, d->Width, d->Height, 0, d->Format, d->NumChannels)
             : create_array(array, 0, 0, 0, 0, (CUarray_format)0, 0);
}

MOCK_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return d ? create_array(array, 1, d->Width, d->Height, d->Depth, d->Format, d->NumChannels)
             : create_array(array, 0, 0, 0, 0, (CUarray_format)0, 0);
}

/* Legacy descriptors (unsigned int dimensions): the same arrays. */
MOCK_EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    return d ? create_array(array, 1, d->Width, d->Height, 0, d->Format, d->NumChannels)
             : create_array(array, 0, 0, 0, 0, (CUarray_format)0, 0);
}

MOCK_EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    return d ? create_array(array, 1, d->Width, d->Height, d->Depth, d->Format, d->NumChannels)
             : create_array(array, 0, 0, 0, 0, (CUarray_format)0, 0);
}

MOCK_EXPORT CUresult cuArrayDestroy(CUarray array)
{
    return destroy((uint64_t)(uintptr_t)array, MOCK_ALLOC_ARRAY);
}

static size_t halve(size_t size, unsigned int level)
{
    if (size == 0)
        return 0;
    size_t reduced = level >= sizeof(size_t) * 8 ? 0 : size >> level;
    return reduced ? reduced : 1;
}

MOCK_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array,
                                            const CUDA_ARRAY3D_DESCRIPTOR *descriptor,
                                            unsigned int levels)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!array || !descriptor || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t largest = descriptor->Width;
    if (descriptor->Height > largest)
        largest = descriptor->Height;
    if (descriptor->Depth > largest)
        largest = descriptor->Depth;
    unsigned int max_levels = 0;
    for (size_t s = largest; s > 0; s >>= 1)
        max_levels++;
    if (levels > max_levels)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    for (unsigned int level = 0; level < levels; level++) {
        uint64_t bytes = 0;
        if (!level_bytes(halve(descriptor->Width, level), halve(descriptor->Height, level),
                         halve(descriptor->Depth, level), descriptor->Format,
                         descriptor->NumChannels, &bytes) ||
            __builtin_add_overflow(total, bytes, &total))
            return CUDA_ERROR_INVALID_VALUE;
    }
    uint64_t handle = 0;
    rc = create(&handle, total, MOCK_ALLOC_MIPMAP);
    if (rc == CUDA_SUCCESS)
        *array = (CUmipmappedArray)(uintptr_t)handle;
    return rc;
}

MOCK_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
    return destroy((uint64_t)(uintptr_t)array, MOCK_ALLOC_MIPMAP);
}
