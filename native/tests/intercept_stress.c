/*
 * intercept_stress THREADS ITERATIONS CHUNK: threads allocate and free CHUNK-sized blocks
 * (cuMemAlloc_v2 / cuMemFree_v2, some through cuMemAllocManaged) concurrently against the
 * limit, each holding up to 4 at a time. Afterwards usage must be back where it started.
 * Prints: used_before= used_after= ok= refused=
 */
#include <pthread.h>
#include <stdatomic.h>

#include "intercept_util.h"

static CUcontext context;
static int iterations;
static size_t chunk;
static atomic_long ok_count, refused_count;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    EXPECT_RC(cuCtxSetCurrent(context), CUDA_SUCCESS);
    CUdeviceptr held[4] = {0, 0, 0, 0};
    for (int i = 0; i < iterations; i++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 16) & 3u);
        if (held[k] != 0) {
            EXPECT_RC(cuMemFree_v2(held[k]), CUDA_SUCCESS);
            held[k] = 0;
            continue;
        }
        CUresult rc = (seed >> 20) & 1u ? cuMemAlloc_v2(&held[k], chunk)
                                        : cuMemAllocManaged(&held[k], chunk, 1);
        if (rc == CUDA_SUCCESS) {
            atomic_fetch_add(&ok_count, 1);
        } else {
            EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY);
            held[k] = 0;
            atomic_fetch_add(&refused_count, 1);
        }
    }
    for (int k = 0; k < 4; k++) {
        if (held[k] != 0) {
            EXPECT_RC(cuMemFree_v2(held[k]), CUDA_SUCCESS);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        return 2;
    }
    int threads = atoi(argv[1]);
    iterations = atoi(argv[2]);
    chunk = (size_t)strtoull(argv[3], NULL, 0);
    EXPECT(threads > 0 && threads <= 64);
    context = test_context();
    unsigned long long before = test_used();
    pthread_t ids[64];
    for (int t = 0; t < threads; t++) {
        EXPECT(pthread_create(&ids[t], NULL, worker, (void *)(uintptr_t)(t + 1)) == 0);
    }
    for (int t = 0; t < threads; t++) {
        EXPECT(pthread_join(ids[t], NULL) == 0);
    }
    unsigned long long after = test_used();
    printf("used_before=%llu\nused_after=%llu\nok=%ld\nrefused=%ld\n", before, after,
           atomic_load(&ok_count), atomic_load(&refused_count));
    EXPECT(before == after);
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
