/*
 * intercept_worker CHUNK: one process of a multi-process test, driven through its stdin.
 * Creates a context, prints "ready", waits for a line; then allocates CHUNK-sized blocks until
 * refused, prints "count=<n>" and "used=<bytes the container uses>", waits for a line, frees
 * everything and exits. If stdin closes early it exits without freeing (like a crash would not,
 * but an orderly exit does release its slot).
 */
#include <string.h>

#include "intercept_util.h"

static int wait_line(void) {
    char line[64];
    return fgets(line, sizeof line, stdin) != NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    size_t chunk = (size_t)strtoull(argv[1], NULL, 0);
    CUcontext context = test_context();
    printf("ready\n");
    fflush(stdout);
    if (!wait_line()) {
        return 0;
    }
    static CUdeviceptr held[100000];
    int count = 0;
    while (count < 100000) {
        CUresult rc = cuMemAlloc_v2(&held[count], chunk);
        if (rc != CUDA_SUCCESS) {
            EXPECT(rc == CUDA_ERROR_OUT_OF_MEMORY);
            break;
        }
        count++;
    }
    printf("count=%d\nused=%llu\n", count, test_used());
    fflush(stdout);
    if (!wait_line()) {
        return 0;
    }
    for (int i = 0; i < count; i++) {
        EXPECT_RC(cuMemFree_v2(held[i]), CUDA_SUCCESS);
    }
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    printf("done\n");
    return 0;
}
