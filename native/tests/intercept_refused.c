/*
 * intercept_refused: what a process gets when the library refuses to run it unprotected
 * (malformed limits, unusable state file). Prints the codes of a context creation, a primary
 * context retain and an allocation: ctx_rc= primary_rc= alloc_rc=
 */
#include "intercept_util.h"

int main(void) {
    CUdevice device;
    CUcontext context = NULL;
    EXPECT_RC(cuInit(0), CUDA_SUCCESS);
    EXPECT_RC(cuDeviceGet(&device, 0), CUDA_SUCCESS);
    CUresult rc = cuCtxCreate_v2(&context, 0, device);
    printf("ctx_rc=%d\n", (int)rc);
    CUcontext primary = NULL;
    CUresult prc = cuDevicePrimaryCtxRetain(&primary, device);
    printf("primary_rc=%d\n", (int)prc);
    if (prc == CUDA_SUCCESS) {
        EXPECT_RC(cuCtxSetCurrent(primary), CUDA_SUCCESS);
    }
    CUdeviceptr pointer = 0;
    CUresult arc = cuMemAlloc_v2(&pointer, 1 << 20);
    printf("alloc_rc=%d\n", (int)arc);
    if (arc == CUDA_SUCCESS) {
        EXPECT_RC(cuMemFree_v2(pointer), CUDA_SUCCESS);
    }
    if (prc == CUDA_SUCCESS) {
        EXPECT_RC(cuDevicePrimaryCtxRelease_v2(device), CUDA_SUCCESS);
    }
    if (rc == CUDA_SUCCESS) {
        EXPECT_RC(cuCtxDestroy_v2(context), CUDA_SUCCESS);
    }
    return 0;
}
