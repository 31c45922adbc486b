/*
 * intercept_legacy MODE BYTES: the pre-_v2 entry points (32-bit sizes and pointers) and the newer
 * context-creation versions, called the way an old binary or a new runtime calls them.
 *   alloc        legacy context, cuMemAlloc / cuMemAllocPitch / cuArrayCreate / cuArray3DCreate
 *                charged and freed, an allocation of BYTES refused, the legacy queries;
 *                then contexts from cuCtxCreate_v3 and _v4 charged, cuCtxDestroy releasing, and
 *                the pre-11.0 cuDevicePrimaryCtxRelease releasing the primary context
 *   info         the legacy queries only (cuMemGetInfo, cuDeviceTotalMem), 32-bit clamped
 *   contexts     each cuCtxCreate version once the limit leaves room for one more context only
 *   procaddress  the legacy exports through cuGetProcAddress at version 3000, cuCtxCreate at
 *                11040 and 12050: our hooks, and an allocation of BYTES refused
 * Prints key=value lines (used* are bytes in use as cuMemGetInfo_v2 reports them).
 */
#include <dlfcn.h>
#include <string.h>

#include "intercept_util.h"

static unsigned long long legacy_used(void) {
    unsigned int free_bytes = 0, total_bytes = 0;
    EXPECT_RC(cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
    return (unsigned long long)total_bytes - free_bytes;
}

static void print_legacy_info(void) {
    unsigned int free_bytes = 0, total_bytes = 0, device_total = 0;
    EXPECT_RC(cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceTotalMem(&device_total, 0), CUDA_SUCCESS);
    printf("v1_free=%u\nv1_total=%u\nv1_device_total=%u\n", free_bytes, total_bytes,
           device_total);
}

static CUcontext legacy_context(void) {
    CUcontext context = NULL;
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxCreate(&context, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(context), CUDA_SUCCESS);
    return context;
}

static void linear(unsigned int refused_bytes) {
    CUdeviceptr_v1 pointer = 0, pitched = 0, refused = 0;
    EXPECT_RC(cuMemAlloc(&pointer, 100 * MIB), CUDA_SUCCESS);
    EXPECT(pointer != 0);
    printf("used_alloc=%llu\n", test_used());
    unsigned int pitch = 0;
    EXPECT_RC(cuMemAllocPitch(&pitched, &pitch, 1000, 2048, 4), CUDA_SUCCESS);
    printf("pitch=%u\nused_pitch=%llu\n", pitch, test_used());
    printf("refused_rc=%d\n", (int)cuMemAlloc(&refused, refused_bytes));
    printf("refused_pitch_rc=%d\n", (int)cuMemAllocPitch(&refused, &pitch, refused_bytes, 1, 4));
    EXPECT_RC(cuMemFree(pitched), CUDA_SUCCESS);
    EXPECT_RC(cuMemFree(pointer), CUDA_SUCCESS);
    printf("used_freed=%llu\n", test_used());
}

static void arrays(void) {
    const CUDA_ARRAY_DESCRIPTOR_v1 flat = {1024, 1024, CU_AD_FORMAT_FLOAT, 4}; /* 16 MiB */
    const CUDA_ARRAY3D_DESCRIPTOR_v1 cube = {256, 256, 16, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    const CUDA_ARRAY_DESCRIPTOR_v1 huge = {65536, 65536, CU_AD_FORMAT_FLOAT, 4}; /* 64 GiB */
    CUarray a = NULL, b = NULL, c = NULL;
    EXPECT_RC(cuArrayCreate(&a, &flat), CUDA_SUCCESS);
    printf("used_array=%llu\n", test_used());
    EXPECT_RC(cuArray3DCreate(&b, &cube), CUDA_SUCCESS);
    printf("used_array3d=%llu\n", test_used());
    printf("refused_array_rc=%d\n", (int)cuArrayCreate(&c, &huge));
    EXPECT_RC(cuArrayDestroy(b), CUDA_SUCCESS);
    EXPECT_RC(cuArrayDestroy(a), CUDA_SUCCESS);
    printf("used_arrays_freed=%llu\n", test_used());
}

/* Contexts made with _v3 and _v4 are charged like any other and released by cuCtxDestroy. */
static void newer_contexts(void) {
    CUexecAffinityParam affinity = {CU_EXEC_AFFINITY_TYPE_SM_COUNT, {{8}}};
    CUctxCreateParams params = {&affinity, 1, NULL};
    CUcontext v3 = NULL, v4 = NULL;
    EXPECT_RC(cuCtxCreate_v3(&v3, &affinity, 1, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(v3), CUDA_SUCCESS);
    printf("used_v3=%llu\n", test_used());
    EXPECT_RC(cuCtxCreate_v4(&v4, &params, 0, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(v4), CUDA_SUCCESS);
    printf("used_v4=%llu\n", test_used());
    EXPECT_RC(cuCtxDestroy(v4), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(v3), CUDA_SUCCESS);
    printf("used_v4_destroyed=%llu\n", test_used());
    EXPECT_RC(cuCtxDestroy_v2(v3), CUDA_SUCCESS);
}

/* The pre-11.0 cuDevicePrimaryCtxRelease gives the primary context's charge back. */
static void primary(void) {
    CUcontext context = NULL, probe = NULL;
    EXPECT_RC(cuDevicePrimaryCtxRetain(&context, 0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxSetCurrent(context), CUDA_SUCCESS);
    printf("used_primary=%llu\n", test_used());
    EXPECT_RC(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    EXPECT_RC(cuCtxCreate_v2(&probe, 0, 0), CUDA_SUCCESS);
    printf("used_primary_released=%llu\n", test_used()); /* the probe context only */
    EXPECT_RC(cuCtxDestroy_v2(probe), CUDA_SUCCESS);
}

static int mode_alloc(unsigned int bytes) {
    CUcontext context = legacy_context();
    printf("used_ctx=%llu\nused_ctx_v1=%llu\n", test_used(), legacy_used());
    linear(bytes);
    arrays();
    print_legacy_info();
    EXPECT_RC(cuCtxDestroy(context), CUDA_SUCCESS);
    newer_contexts();
    primary();
    return 0;
}

static int mode_info(void) {
    CUcontext context = legacy_context();
    print_legacy_info();
    EXPECT_RC(cuCtxDestroy(context), CUDA_SUCCESS);
    return 0;
}

/* The limit leaves room for one context: the first (v3) fits, every later version is refused. */
static int mode_contexts(void) {
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    CUcontext first = NULL, other = NULL;
    CUctxCreateParams params = {NULL, 0, NULL};
    EXPECT_RC(cuCtxCreate_v3(&first, NULL, 0, 0, 0), CUDA_SUCCESS);
    printf("v4_rc=%d\n", (int)cuCtxCreate_v4(&other, &params, 0, 0));
    printf("v2_rc=%d\n", (int)cuCtxCreate_v2(&other, 0, 0));
    printf("v1_rc=%d\n", (int)cuCtxCreate(&other, 0, 0));
    EXPECT_RC(cuCtxDestroy(first), CUDA_SUCCESS);
    /* The destroy gave the room back: a _v4 context fits now. */
    printf("v4_after_rc=%d\n", (int)cuCtxCreate_v4(&other, NULL, 0, 0));
    EXPECT_RC(cuCtxDestroy_v2(other), CUDA_SUCCESS);
    return 0;
}

typedef CUresult (*alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
typedef CUresult (*info_v1_fn)(unsigned int *, unsigned int *);

static void *resolve(const char *symbol, int version) {
    void *function = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_RC(cuGetProcAddress_v2(symbol, &function, version, 0, &status), CUDA_SUCCESS);
    EXPECT(status == CU_GET_PROC_ADDRESS_SUCCESS && function != NULL);
    void *again = NULL;
    EXPECT_RC(cuGetProcAddress(symbol, &again, version, 0), CUDA_SUCCESS);
    EXPECT(again == function);
    return function;
}

/* 1 when the pointer is the interception library's export of that name, not the driver's. */
static int is_hook(void *function, const char *name) {
    Dl_info info;
    return dladdr(function, &info) != 0 && info.dli_fname != NULL && info.dli_sname != NULL &&
           strstr(info.dli_fname, "libgpushare") != NULL && strcmp(info.dli_sname, name) == 0;
}

static int mode_procaddress(unsigned int bytes) {
    CUcontext context = legacy_context();
    static const char *const legacy[] = {"cuMemAlloc",      "cuMemAllocPitch", "cuMemFree",
                                         "cuMemGetInfo",    "cuDeviceTotalMem", "cuCtxCreate",
                                         "cuCtxDestroy",    "cuArrayCreate",   "cuArray3DCreate"};
    for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++) {
        printf("%s@3000=%d\n", legacy[i], is_hook(resolve(legacy[i], 3000), legacy[i]));
    }
    printf("cuDevicePrimaryCtxRelease@10020=%d\n",
           is_hook(resolve("cuDevicePrimaryCtxRelease", 10020), "cuDevicePrimaryCtxRelease"));
    printf("cuCtxCreate@11040=%d\n", is_hook(resolve("cuCtxCreate", 11040), "cuCtxCreate_v3"));
    printf("cuCtxCreate@12050=%d\n", is_hook(resolve("cuCtxCreate", 12050), "cuCtxCreate_v4"));
    CUdeviceptr_v1 pointer = 0;
    alloc_v1_fn alloc = (alloc_v1_fn)resolve("cuMemAlloc", 3000);
    printf("alloc_rc=%d\n", (int)alloc(&pointer, bytes));
    unsigned int free_bytes = 0, total_bytes = 0;
    EXPECT_RC(((info_v1_fn)resolve("cuMemGetInfo", 3000))(&free_bytes, &total_bytes),
              CUDA_SUCCESS);
    printf("info_total=%u\n", total_bytes);
    EXPECT_RC(cuCtxDestroy(context), CUDA_SUCCESS);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        return 2;
    }
    unsigned int bytes = argc > 2 ? (unsigned int)strtoul(argv[2], NULL, 0) : 0;
    if (strcmp(argv[1], "alloc") == 0) {
        return mode_alloc(bytes);
    }
    if (strcmp(argv[1], "info") == 0) {
        return mode_info();
    }
    if (strcmp(argv[1], "contexts") == 0) {
        return mode_contexts();
    }
    if (strcmp(argv[1], "procaddress") == 0) {
        return mode_procaddress(bytes);
    }
    return 2;
}
