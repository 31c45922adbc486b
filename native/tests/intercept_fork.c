/*
 * intercept_fork BYTES: the parent allocates BYTES and forks. The child sees the shared usage,
 * allocates and frees BYTES of its own (its own slot), and exits; the parent's usage is then
 * unchanged. Prints: parent_used= child_used= child_alloc_rc= child_after_free= parent_after=
 */
#include <sys/wait.h>
#include <unistd.h>

#include "intercept_util.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        return 2;
    }
    size_t bytes = (size_t)strtoull(argv[1], NULL, 0);
    CUcontext context = test_context();
    CUdeviceptr pointer = 0;
    EXPECT_RC(cuMemAlloc_v2(&pointer, bytes), CUDA_SUCCESS);
    printf("parent_used=%llu\n", test_used());
    fflush(stdout);
    pid_t child = fork();
    EXPECT(child >= 0);
    if (child == 0) {
        printf("child_used=%llu\n", test_used());
        CUdeviceptr mine = 0;
        CUresult rc = cuMemAlloc_v2(&mine, bytes);
        printf("child_alloc_rc=%d\n", (int)rc);
        printf("child_used_after_alloc=%llu\n", test_used());
        if (rc == CUDA_SUCCESS) {
            EXPECT_RC(cuMemFree_v2(mine), CUDA_SUCCESS);
        }
        /* Freeing the parent's pointer in the child must not give back the parent's charge. */
        printf("child_after_free=%llu\n", test_used());
        fflush(stdout);
        exit(0);
    }
    int status = 0;
    EXPECT(waitpid(child, &status, 0) == child);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("parent_after=%llu\n", test_used());
    EXPECT_RC(cuMemFree_v2(pointer), CUDA_SUCCESS);
    printf("parent_end=%llu\n", test_used());
    EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    return 0;
}
