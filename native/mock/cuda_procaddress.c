/*
 * Mock CUDA driver: cuGetProcAddress and cuGetProcAddress_v2.
 *
 * Like the real driver, a base name ("cuMemAlloc") resolves to the newest export whose ABI the
 * requested CUDA version knows (the legacy 32-bit "cuMemAlloc" below 3020, "cuMemAlloc_v2" from
 * 3020; "cuCtxCreate" to _v3 from 11040 and _v4 from 12050), and
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM selects the _ptsz variant where there is one.
 */
#include "cuda_internal.h"

#include <string.h>

struct proc_entry {
    const char *name;  /* base name, as asked for */
    int version;       /* first CUDA version whose headers map the name to this export */
    bool per_thread;   /* the _ptsz variant */
    void *function;
};

#define ENTRY(base, version, export) {base, version, false, (void *)(export)}
#define PTSZ(base, version, export) {base, version, true, (void *)(export)}

static const struct proc_entry g_table[] = {
    ENTRY("cuInit", 2000, cuInit),
    ENTRY("cuDriverGetVersion", 2020, cuDriverGetVersion),
    ENTRY("cuDeviceGet", 2000, cuDeviceGet),
    ENTRY("cuDeviceGetCount", 2000, cuDeviceGetCount),
    ENTRY("cuDeviceGetName", 2000, cuDeviceGetName),
    ENTRY("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    ENTRY("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    ENTRY("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    ENTRY("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    ENTRY("cuCtxCreate", 2000, cuCtxCreate),
    ENTRY("cuCtxCreate", 3020, cuCtxCreate_v2),
    ENTRY("cuCtxCreate", 11040, cuCtxCreate_v3),
    ENTRY("cuCtxCreate", 12050, cuCtxCreate_v4),
    ENTRY("cuCtxDestroy", 2000, cuCtxDestroy),
    ENTRY("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    ENTRY("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    ENTRY("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    ENTRY("cuCtxGetDevice", 2000, cuCtxGetDevice),
    ENTRY("cuCtxSynchronize", 2000, cuCtxSynchronize),
    ENTRY("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    ENTRY("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    ENTRY("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    ENTRY("cuMemGetInfo", 2000, cuMemGetInfo),
    ENTRY("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    ENTRY("cuMemAlloc", 2000, cuMemAlloc),
    ENTRY("cuMemAlloc", 3020, cuMemAlloc_v2),
    ENTRY("cuMemAllocPitch", 2000, cuMemAllocPitch),
    ENTRY("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    ENTRY("cuMemAllocManaged", 6000, cuMemAllocManaged),
    ENTRY("cuMemFree", 2000, cuMemFree),
    ENTRY("cuMemFree", 3020, cuMemFree_v2),
    ENTRY("cuMemAllocAsync", 11020, cuMemAllocAsync),
    PTSZ("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    ENTRY("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    PTSZ("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    ENTRY("cuMemFreeAsync", 11020, cuMemFreeAsync),
    PTSZ("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    ENTRY("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
    ENTRY("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
    ENTRY("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    ENTRY("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
    ENTRY("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
    ENTRY("cuMemPoolCreate", 11020, cuMemPoolCreate),
    ENTRY("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    ENTRY("cuMemCreate", 10020, cuMemCreate),
    ENTRY("cuMemRelease", 10020, cuMemRelease),
    ENTRY("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    ENTRY("cuArrayCreate", 2000, cuArrayCreate),
    ENTRY("cuArrayCreate", 3020, cuArrayCreate_v2),
    ENTRY("cuArray3DCreate", 2000, cuArray3DCreate),
    ENTRY("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    ENTRY("cuArrayDestroy", 2000, cuArrayDestroy),
    ENTRY("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    ENTRY("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    ENTRY("cuLaunchKernel", 4000, cuLaunchKernel),
    PTSZ("cuLaunchKernel", 7000, cuLaunchKernel_ptsz),
    ENTRY("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    PTSZ("cuLaunchKernelEx", 11060, cuLaunchKernelEx_ptsz),
    ENTRY("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    PTSZ("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel_ptsz),
    ENTRY("cuGraphCreate", 10000, cuGraphCreate),
    ENTRY("cuGraphDestroy", 10000, cuGraphDestroy),
    ENTRY("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    ENTRY("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    ENTRY("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    ENTRY("cuGraphLaunch", 10000, cuGraphLaunch),
    PTSZ("cuGraphLaunch", 10000, cuGraphLaunch_ptsz),
    ENTRY("cuStreamCreate", 2000, cuStreamCreate),
    ENTRY("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    ENTRY("cuStreamSynchronize", 2000, cuStreamSynchronize),
    ENTRY("cuStreamGetCtx", 9020, cuStreamGetCtx),
    PTSZ("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    ENTRY("cuFuncGetAttribute", 2020, cuFuncGetAttribute),
    ENTRY("cuGetProcAddress", 11030, cuGetProcAddress),
    ENTRY("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

/* The best export for (symbol, version, per_thread), or the reason there is none. */
static const struct proc_entry *lookup(const char *symbol, int version, bool per_thread,
                                       CUdriverProcAddressQueryResult *status)
{
    const struct proc_entry *best = NULL;
    bool known = false;
    for (int pass = per_thread ? 0 : 1; pass < 2 && !best; pass++) {
        bool want_ptsz = pass == 0; /* per-thread asks try the _ptsz variants first */
        for (size_t i = 0; i < sizeof g_table / sizeof g_table[0]; i++) {
            const struct proc_entry *entry = &g_table[i];
            if (strcmp(entry->name, symbol) != 0)
                continue;
            known = true;
            if (entry->per_thread != want_ptsz || entry->version > version)
                continue;
            if (!best || entry->version > best->version)
                best = entry;
        }
    }
    *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                   : (known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return best;
}

static CUresult resolve(const char *symbol, void **function, int cuda_version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !function)
        return CUDA_ERROR_INVALID_VALUE;
    *function = NULL;
    /* Works before cuInit (the runtime resolves cuInit itself this way). */
    int driver_version =
        mock_setup("cuda") == 0 ? mock_cfg()->driver_version : MOCK_DEFAULT_DRIVER_VERSION;
    if (cuda_version <= 0 || cuda_version > driver_version ||
        (flags != CU_GET_PROC_ADDRESS_DEFAULT && flags != CU_GET_PROC_ADDRESS_LEGACY_STREAM &&
         flags != CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    const struct proc_entry *entry =
        lookup(symbol, cuda_version, flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
               status);
    if (entry)
        *function = entry->function;
    return CUDA_SUCCESS;
}

MOCK_EXPORT CUresult cuGetProcAddress(const char *symbol, void **function, int cuda_version,
                                      cuuint64_t flags)
{
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = resolve(symbol, function, cuda_version, flags, &status);
    if (rc == CUDA_SUCCESS && status != CU_GET_PROC_ADDRESS_SUCCESS)
        return CUDA_ERROR_NOT_FOUND;
    return rc;
}

MOCK_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **function, int cuda_version,
                                         cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    CUdriverProcAddressQueryResult local = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = resolve(symbol, function, cuda_version, flags, &local);
    if (status && rc == CUDA_SUCCESS)
        *status = local;
    return rc;
}
