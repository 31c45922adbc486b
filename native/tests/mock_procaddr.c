/*
 * mock_procaddr SYMBOL VERSION FLAGS: resolves SYMBOL through cuGetProcAddress_v2 and
 * cuGetProcAddress; prints rc_v2, status, export (the exported name the pointer belongs to, or
 * NULL) and rc_v1.
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <dlfcn.h>

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: mock_procaddr SYMBOL VERSION FLAGS\n");
        return 2;
    }
    int version = atoi(argv[2]);
    cuuint64_t flags = strtoull(argv[3], NULL, 10);
    void *function = (void *)&version; /* must be overwritten */
    CUdriverProcAddressQueryResult status = (CUdriverProcAddressQueryResult)-1;
    CUresult rc = cuGetProcAddress_v2(argv[1], &function, version, flags, &status);
    KV("rc_v2", "%d", rc);
    KV("status", "%d", (int)status);
    Dl_info info;
    if (function && dladdr(function, &info) != 0 && info.dli_sname)
        KV("export", "%s", info.dli_sname);
    else
        KV("export", "%s", function ? "?" : "NULL");
    void *function_v1 = NULL;
    KV("rc_v1", "%d", cuGetProcAddress(argv[1], &function_v1, version, flags));
    return 0;
}
