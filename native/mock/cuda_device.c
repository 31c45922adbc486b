/* Mock CUDA driver: initialisation, version and device queries. */
#include "cuda_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static atomic_bool g_initialized;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;

CUresult mock_check_init(void)
{
    return atomic_load(&g_initialized) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

static void init_once(void)
{
    if (mock_setup("cuda") != 0) {
        g_init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    mock_pools_init();
    g_init_result = CUDA_SUCCESS;
    atomic_store(&g_initialized, true);
}

MOCK_EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (pthread_once(&g_init_once, init_once) != 0)
        return CUDA_ERROR_UNKNOWN;
    return g_init_result;
}

MOCK_EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    /* Like the real driver, this works before cuInit. */
    *version = mock_setup("cuda") == 0 ? mock_cfg()->driver_version : MOCK_DEFAULT_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDeviceGetCount(int *count)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = mock_cfg()->device_count;
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDeviceGetName(char *name, int length, CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!name || length <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)length, "%s", mock_cfg()->devices[device].name);
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDeviceGetUuid(unsigned char uuid[16], CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid, mock_cfg()->devices[device].uuid, 16);
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute,
                                          CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    switch ((int)attribute) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = mock_cfg()->devices[device].sm_count;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *value = 1024;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *value = 32;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE:
        *value = 1980000; /* kHz */
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
        *value = 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *value = device + 1;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
        *value = 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *value = 9;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *value = 0;
        return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        *value = 1;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

MOCK_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)mock_cfg()->devices[device].memory_bytes;
    return CUDA_SUCCESS;
}

/* Legacy: 32 bits; a larger memory reads UINT_MAX, as from the real driver. */
MOCK_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice device)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!mock_valid_device(device))
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t total = mock_cfg()->devices[device].memory_bytes;
    *bytes = total > UINT32_MAX ? UINT32_MAX : (unsigned int)total;
    return CUDA_SUCCESS;
}

/* Not intercepted by gpushare: exported so that pass-through can be tested. */
MOCK_EXPORT CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute,
                                        CUfunction function)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!function)
        return CUDA_ERROR_INVALID_HANDLE;
    switch (attribute) {
    case 0: /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
        *value = 1024;
        return CUDA_SUCCESS;
    case 4: /* CU_FUNC_ATTRIBUTE_NUM_REGS */
        *value = 32;
        return CUDA_SUCCESS;
    default:
        *value = 0;
        return CUDA_SUCCESS;
    }
}
