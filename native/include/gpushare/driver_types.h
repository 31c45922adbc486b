/*
 * The CUDA driver API and NVML types and prototypes that gpushare uses.
 *
 * Declared here, from NVIDIA's public API documentation, so that the interception library and
 * the mock driver build without the CUDA toolkit. Only what gpushare touches is declared; the
 * layouts and values are those of the public headers (cuda.h, nvml.h) for 64-bit Linux.
 */
#ifndef GPUSHARE_DRIVER_TYPES_H
#define GPUSHARE_DRIVER_TYPES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CUDA driver API ------------------------------------------------------------------ */

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2 */
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
} CUdevice_attribute;

typedef enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;

typedef struct {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;

typedef enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
} CUmemAllocationType;

typedef struct {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct {
    CUmemAllocationType type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2,
} CUdriverProcAddress_flags;

typedef enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

/* The entry points gpushare intercepts or the mock implements. */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetName(char *name, int length, CUdevice device);
CUresult cuDeviceGetUuid(unsigned char uuid[16], CUdevice device);
CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device);
CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device);
CUresult cuCtxDestroy_v2(CUcontext context);
CUresult cuCtxSetCurrent(CUcontext context);
CUresult cuCtxGetCurrent(CUcontext *context);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);
CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes);
CUresult cuMemAllocPitch_v2(CUdeviceptr *pointer, size_t *pitch, size_t width_bytes, size_t height,
                            unsigned int element_size_bytes);
CUresult cuMemAllocManaged(CUdeviceptr *pointer, size_t bytes, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr pointer);
CUresult cuMemAllocAsync(CUdeviceptr *pointer, size_t bytes, CUstream stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool,
                                 CUstream stream);
CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *descriptor);
CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *descriptor);
CUresult cuArrayDestroy(CUarray array);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *descriptor,
                                unsigned int levels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray array);
CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                        unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                        unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                        void **params, void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                                   unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                                   unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                                   void **params);
CUresult cuGraphLaunch(CUgraphExec graph, CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuGetProcAddress(const char *symbol, void **function, int cuda_version, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **function, int cuda_version,
                             cuuint64_t flags, CUdriverProcAddressQueryResult *status);

/* Legacy (pre-_v2, CUDA < 3.2) entry points, still exported by the driver for programs built
 * against old headers (cuda.h declares them under __CUDA_API_VERSION_INTERNAL): 32-bit device
 * pointers and sizes, and array descriptors with unsigned int dimensions. */
typedef unsigned int CUdeviceptr_v1;

typedef struct {
    unsigned int Width;
    unsigned int Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

typedef struct {
    unsigned int Width;
    unsigned int Height;
    unsigned int Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice device);
CUresult cuCtxCreate(CUcontext *context, unsigned int flags, CUdevice device);
CUresult cuCtxDestroy(CUcontext context);
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes);
CUresult cuMemAlloc(CUdeviceptr_v1 *pointer, unsigned int bytes);
CUresult cuMemAllocPitch(CUdeviceptr_v1 *pointer, unsigned int *pitch, unsigned int width_bytes,
                         unsigned int height, unsigned int element_size_bytes);
CUresult cuMemFree(CUdeviceptr_v1 pointer);
CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *descriptor);
CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *descriptor);
CUresult cuDevicePrimaryCtxRelease(CUdevice device); /* before 11.0; same ABI as _v2 */

/* Context creation with execution affinity (CUDA 11.4) and with creation parameters (12.5). */
typedef enum {
    CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0,
} CUexecAffinityType;

typedef struct {
    unsigned int val;
} CUexecAffinitySmCount;

typedef struct {
    CUexecAffinityType type;
    union {
        CUexecAffinitySmCount smCount;
    } param;
} CUexecAffinityParam;

typedef struct CUctxCigParam_st CUctxCigParam; /* only passed through */

typedef struct {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    CUctxCigParam *cigParams;
} CUctxCreateParams;

CUresult cuCtxCreate_v3(CUcontext *context, CUexecAffinityParam *params, int count,
                        unsigned int flags, CUdevice device);
CUresult cuCtxCreate_v4(CUcontext *context, CUctxCreateParams *params, unsigned int flags,
                        CUdevice device);

/* Which device a stream-ordered allocation lands on: the stream's context, a pool's location. */
typedef enum {
    CU_MEM_HANDLE_TYPE_NONE = 0x0,
} CUmemAllocationHandleType;

typedef struct {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

CUresult cuStreamGetCtx(CUstream stream, CUcontext *context);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice device);
CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool);

/* ---- NVML ------------------------------------------------------------------------------ */

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

/* nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof | (2 << 24) */
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos);

/* Per-process utilisation: one sample per process that ran on the device since the timestamp. */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp in microseconds */
    unsigned int smUtil;          /* percent */
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp);
const char *nvmlErrorString(nvmlReturn_t result);

/* ---- Appended for the mock driver (values and layouts from NVIDIA's public headers) ------ */

enum {
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_PERMITTED = 800,
};

enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
};

typedef struct CUgraph_st *CUgraph;

typedef enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

typedef enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
} CUmemAllocationGranularity_flags;

typedef enum {
    CU_MEM_ATTACH_GLOBAL = 0x1,
    CU_MEM_ATTACH_HOST = 0x2,
    CU_MEM_ATTACH_SINGLE = 0x4,
} CUmemAttach_flags;

typedef int CUfunction_attribute; /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0, ... */

/* cuLaunchKernelEx: the attribute value is a 64-byte union in cuda.h; only its size matters. */
typedef struct CUlaunchAttribute_st {
    int id; /* CUlaunchAttributeID */
    char pad[8 - sizeof(int)];
    union {
        char pad[64];
    } value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute, void *value);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction function, void **params,
                          void **extra);
CUresult cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction function);

/* Per-thread-default-stream variants (what cuda.h maps to under CUDA_API_PER_THREAD_DEFAULT_STREAM). */
CUresult cuLaunchKernel_ptsz(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                             unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                             unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                             void **params, void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction function, void **params,
                               void **extra);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction function, unsigned int grid_x,
                                        unsigned int grid_y, unsigned int grid_z,
                                        unsigned int block_x, unsigned int block_y,
                                        unsigned int block_z, unsigned int shared_bytes,
                                        CUstream stream, void **params);
CUresult cuGraphLaunch_ptsz(CUgraphExec graph, CUstream stream);
CUresult cuStreamSynchronize_ptsz(CUstream stream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *pointer, size_t bytes, CUstream stream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool,
                                      CUstream stream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr pointer, CUstream stream);

/* Mock-only: how many kernels one launch of graphs instantiated from `graph` counts as. */
CUresult gpushareMockGraphSetKernelCount(CUgraph graph, unsigned int kernels);

enum {
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

typedef enum {
    NVML_TEMPERATURE_GPU = 0,
} nvmlTemperatureSensors_t;

#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor,
                                      unsigned int *temperature_c);
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power_mw);
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor);

/* ---- Appended for the device plugin: discovery and health (nvml.h values and layouts) ---- */

enum {
    NVML_ERROR_TIMEOUT = 10,
};

typedef enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1,
} nvmlEnableState_t;

#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_NVLINK_MAX_LINKS 18

typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

typedef struct nvmlEventSet_st *nvmlEventSet_t;

#define nvmlEventTypeSingleBitEccError 0x0000000000000001ULL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002ULL
#define nvmlEventTypeXidCriticalError 0x0000000000000008ULL

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData; /* the Xid, for nvmlEventTypeXidCriticalError */
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, int *node);
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *active);
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t *pci);
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                    nvmlEnableState_t *pending);
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set);
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                              unsigned long long *event_types);
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long event_types,
                                      nvmlEventSet_t set);
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeout_ms);
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);

/* Mock-only (any process using the same mock state file sees the effect): queue Xid `xid` as an
 * nvmlEventTypeXidCriticalError event on device `index`; set or clear the device's pending page
 * retirement (what nvmlDeviceGetRetiredPagesPendingStatus reports: "needs a reset"). Both
 * return NVML_SUCCESS, or an NVML error (bad index, unusable config or state file). */
nvmlReturn_t gpushareMockInjectXid(unsigned int index, unsigned long long xid);
nvmlReturn_t gpushareMockSetRetirementPending(unsigned int index, int pending);

#ifdef __cplusplus
}
#endif

#endif /* GPUSHARE_DRIVER_TYPES_H */
