/*
 * intercept_dlsym BYTES: reach the driver through dlopen("libcuda.so.1") + dlsym only.
 * Allocating BYTES through the dlsym'd cuMemAlloc_v2 must be refused by the limit; unknown and
 * unhooked names pass through. Prints:
 *   hooked_alloc_rc= small_alloc_rc= unhooked_same= unknown_null= next_malloc= nvml_total=
 */
#include <dlfcn.h>
#include <string.h>

#include "intercept_util.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*name_fn)(char *, int, CUdevice);

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    size_t bytes = (size_t)strtoull(argv[1], NULL, 0);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(cuda != NULL);
    CUcontext context = test_context();

    alloc_fn alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
    free_fn release = (free_fn)dlsym(cuda, "cuMemFree_v2");
    EXPECT(alloc != NULL && release != NULL);
    CUdeviceptr pointer = 0;
    printf("hooked_alloc_rc=%d\n", (int)alloc(&pointer, bytes));
    CUresult rc = alloc(&pointer, 1 << 20);
    printf("small_alloc_rc=%d\n", (int)rc);
    if (rc == CUDA_SUCCESS) {
        EXPECT_RC(release(pointer), CUDA_SUCCESS);
    }
    /* Same answer through RTLD_DEFAULT. */
    printf("default_same=%d\n", dlsym(RTLD_DEFAULT, "cuMemAlloc_v2") == (void *)alloc);

    /* An unhooked entry point is the driver's own and works. */
    name_fn get_name = (name_fn)dlsym(cuda, "cuDeviceGetName");
    EXPECT(get_name != NULL);
    char name[96] = "";
    EXPECT_RC(get_name(name, (int)sizeof name, 0), CUDA_SUCCESS);
    printf("unhooked_name=%s\n", name);
    printf("unknown_null=%d\n", dlsym(cuda, "cuNoSuchEntryPoint") == NULL);
    /* RTLD_NEXT from the program still finds libc's malloc. */
    void *next = dlsym(RTLD_NEXT, "malloc");
    printf("next_malloc=%d\n", next != NULL);

    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(nvml != NULL);
    typedef nvmlReturn_t (*info_fn)(nvmlDevice_t, nvmlMemory_t *);
    info_fn nvml_info = (info_fn)dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    EXPECT(nvml_info != NULL);
    EXPECT_RC(nvmlInit_v2(), NVML_SUCCESS);
    nvmlDevice_t device;
    EXPECT_RC(nvmlDeviceGetHandleByIndex_v2(0, &device), NVML_SUCCESS);
    nvmlMemory_t memory;
    EXPECT_RC(nvml_info(device, &memory), NVML_SUCCESS);
    printf("nvml_total=%llu\n", memory.total);
    EXPECT_RC(nvmlShutdown(), NVML_SUCCESS);
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    EXPECT(dlclose(nvml) == 0);
    EXPECT(dlclose(cuda) == 0);
    return 0;
}
