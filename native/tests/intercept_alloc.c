/*
 * intercept_alloc API BYTES: exercise one allocation API against the limit.
 *
 * Allocates BYTES (a1), tries a second BYTES (a2), frees a1, allocates BYTES again (a3), frees
 * everything, and prints the return codes and the usage cuMemGetInfo reports at each step:
 *   rc1= rc2= rc_free1= rc3= used0= used1= used_end= total=
 * API: alloc pitch managed async pool create array array3d mipmap
 * Exits non-zero only on a result no limit can explain (a failed free, a bad pointer).
 */
#include <stdint.h>
#include <string.h>

#include "intercept_util.h"

struct allocation {
    int live;
    CUdeviceptr pointer;
    CUarray array;
    CUmipmappedArray mipmap;
    CUmemGenericAllocationHandle handle;
};

static const char *api;
static size_t bytes;
static CUmemoryPool pool;

static CUresult do_alloc(struct allocation *a) {
    memset(a, 0, sizeof *a);
    CUresult rc;
    if (strcmp(api, "alloc") == 0) {
        rc = cuMemAlloc_v2(&a->pointer, bytes);
    } else if (strcmp(api, "pitch") == 0) {
        size_t pitch = 0;
        rc = cuMemAllocPitch_v2(&a->pointer, &pitch, bytes / 1024, 1024, 4);
        if (rc == CUDA_SUCCESS) {
            EXPECT(pitch >= bytes / 1024);
        }
    } else if (strcmp(api, "managed") == 0) {
        rc = cuMemAllocManaged(&a->pointer, bytes, 1 /* CU_MEM_ATTACH_GLOBAL */);
    } else if (strcmp(api, "async") == 0) {
        rc = cuMemAllocAsync(&a->pointer, bytes, NULL);
    } else if (strcmp(api, "pool") == 0) {
        rc = cuMemAllocFromPoolAsync(&a->pointer, bytes, pool, NULL);
    } else if (strcmp(api, "create") == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        rc = cuMemCreate(&a->handle, bytes, &prop, 0);
    } else if (strcmp(api, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR d = {bytes / 4 / 1024, 1024, CU_AD_FORMAT_FLOAT, 1};
        rc = cuArrayCreate_v2(&a->array, &d);
    } else if (strcmp(api, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes / 4 / 64 / 16, 64, 16, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
        rc = cuArray3DCreate_v2(&a->array, &d);
    } else if (strcmp(api, "mipmap") == 0) {
        /* 2 levels of a 2D float image: level 1 is a quarter of level 0. */
        size_t side = 1;
        while ((side * 2) * (side * 2) * 4 * 5 / 4 <= bytes) {
            side *= 2;
        }
        CUDA_ARRAY3D_DESCRIPTOR d = {side, side, 0, CU_AD_FORMAT_FLOAT, 1, 0};
        rc = cuMipmappedArrayCreate(&a->mipmap, &d, 2);
    } else {
        fprintf(stderr, "unknown api %s\n", api);
        exit(2);
    }
    a->live = rc == CUDA_SUCCESS;
    return rc;
}

static CUresult do_free(struct allocation *a) {
    if (!a->live) {
        return CUDA_SUCCESS;
    }
    a->live = 0;
    if (strcmp(api, "async") == 0 || strcmp(api, "pool") == 0) {
        return cuMemFreeAsync(a->pointer, NULL);
    }
    if (strcmp(api, "create") == 0) {
        return cuMemRelease(a->handle);
    }
    if (strcmp(api, "array") == 0 || strcmp(api, "array3d") == 0) {
        return cuArrayDestroy(a->array);
    }
    if (strcmp(api, "mipmap") == 0) {
        return cuMipmappedArrayDestroy(a->mipmap);
    }
    return cuMemFree_v2(a->pointer);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: intercept_alloc API BYTES\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* oom_policy=exit ends the process with _exit */
    api = argv[1];
    bytes = (size_t)strtoull(argv[2], NULL, 0);
    CUcontext context = test_context();
    EXPECT_RC(cuDeviceGetDefaultMemPool(&pool, 0), CUDA_SUCCESS);
    size_t free_bytes = 0, total_bytes = 0;
    EXPECT_RC(cuMemGetInfo_v2(&free_bytes, &total_bytes), CUDA_SUCCESS);
    printf("total=%zu\nused0=%llu\n", total_bytes, test_used());

    struct allocation a1, a2, a3;
    printf("rc1=%d\n", (int)do_alloc(&a1));
    printf("used1=%llu\n", test_used());
    printf("rc2=%d\n", (int)do_alloc(&a2));
    fflush(stdout);
    CUresult rc = do_free(&a1);
    printf("rc_free1=%d\n", (int)rc);
    EXPECT_RC(rc, CUDA_SUCCESS);
    printf("rc3=%d\n", (int)do_alloc(&a3));
    EXPECT_RC(do_free(&a2), CUDA_SUCCESS);
    EXPECT_RC(do_free(&a3), CUDA_SUCCESS);
    if (strcmp(api, "async") == 0 || strcmp(api, "pool") == 0) {
        printf("used_pool_kept=%llu\n", test_used());
        EXPECT_RC(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    }
    printf("used_end=%llu\n", test_used());
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
