/*
 * intercept_procaddress BYTES: resolve entry points through cuGetProcAddress (11030 and later)
 * and cuGetProcAddress_v2 (12000 and later), with the default and the per-thread-default-stream
 * flag, and check that the memory entry points come back limited (an allocation of BYTES is
 * refused) while others pass through. Prints one line per case:
 *   <entry>@<version>/<flags>=<rc>    and    unknown_status=, unhooked_ok=, nested_ok=
 */
#include <dlfcn.h>
#include <string.h>

#include "intercept_util.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*info_fn)(size_t *, size_t *);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t,
                            CUdriverProcAddressQueryResult *);

static size_t bytes;

/* Resolve symbol at (version, flags) with the _v2 entry point when asked to. */
static void *resolve(const char *symbol, int version, cuuint64_t flags, int use_v2) {
    void *function = NULL;
    if (use_v2) {
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        EXPECT_RC(cuGetProcAddress_v2(symbol, &function, version, flags, &status), CUDA_SUCCESS);
        EXPECT(status == CU_GET_PROC_ADDRESS_SUCCESS);
    } else {
        EXPECT_RC(cuGetProcAddress(symbol, &function, version, flags), CUDA_SUCCESS);
    }
    EXPECT(function != NULL);
    return function;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    bytes = (size_t)strtoull(argv[1], NULL, 0);
    CUcontext context = test_context();
    static const int versions[] = {11030, 12000, 12080};
    static const cuuint64_t flag_set[] = {CU_GET_PROC_ADDRESS_DEFAULT,
                                          CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
    for (size_t v = 0; v < sizeof versions / sizeof versions[0]; v++) {
        for (size_t f = 0; f < 2; f++) {
            for (int use_v2 = 0; use_v2 < 2; use_v2++) {
                if (use_v2 && versions[v] < 12000) {
                    continue;
                }
                int version = versions[v];
                cuuint64_t flags = flag_set[f];
                const char *how = use_v2 ? "v2" : "v1";
                CUdeviceptr pointer = 0;
                alloc_fn alloc = (alloc_fn)resolve("cuMemAlloc", version, flags, use_v2);
                printf("cuMemAlloc@%d/%llu/%s=%d\n", version, (unsigned long long)flags, how,
                       (int)alloc(&pointer, bytes));
                alloc_async_fn async =
                    (alloc_async_fn)resolve("cuMemAllocAsync", version, flags, use_v2);
                printf("cuMemAllocAsync@%d/%llu/%s=%d\n", version, (unsigned long long)flags,
                       how, (int)async(&pointer, bytes, NULL));
                /* The per-thread flag must give the _ptsz hook (our export of that name). */
                if (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
                    EXPECT((void *)async == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"));
                } else {
                    EXPECT((void *)async == dlsym(RTLD_DEFAULT, "cuMemAllocAsync"));
                }
                info_fn info = (info_fn)resolve("cuMemGetInfo", version, flags, use_v2);
                size_t free_bytes = 0, total_bytes = 0;
                EXPECT_RC(info(&free_bytes, &total_bytes), CUDA_SUCCESS);
                printf("cuMemGetInfo@%d/%llu/%s=%zu\n", version, (unsigned long long)flags, how,
                       total_bytes);
            }
        }
    }
    /* Unknown names pass through: the driver's own answer. */
    void *function = (void *)1;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult rc = cuGetProcAddress_v2("cuNoSuchEntryPoint", &function, 12080, 0, &status);
    printf("unknown_rc=%d\nunknown_status=%d\nunknown_null=%d\n", (int)rc, (int)status,
           function == NULL);
    /* An unhooked entry point is the driver's own. */
    void *name = resolve("cuDeviceGetName", 12080, 0, 1);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    EXPECT(cuda != NULL);
    printf("unhooked_ok=%d\n", name == dlsym(cuda, "cuDeviceGetName"));
    /* cuGetProcAddress resolving itself gives back something that still hooks. */
    gpa_fn nested = (gpa_fn)resolve("cuGetProcAddress", 11030, 0, 0);
    void *inner = NULL;
    EXPECT_RC(nested("cuMemAlloc", &inner, 12000, 0), CUDA_SUCCESS);
    CUdeviceptr pointer = 0;
    printf("nested_rc=%d\n", (int)((alloc_fn)inner)(&pointer, bytes));
    gpa2_fn nested2 = (gpa2_fn)resolve("cuGetProcAddress", 12000, 0, 1);
    inner = NULL;
    EXPECT_RC(nested2("cuMemAlloc", &inner, 12000, 0, &status), CUDA_SUCCESS);
    printf("nested2_rc=%d\n", (int)((alloc_fn)inner)(&pointer, bytes));
    EXPECT(dlclose(cuda) == 0);
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
