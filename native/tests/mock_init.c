/* mock_init: prints what cuInit and nvmlInit_v2 return (cu_init, nvml_init), for config tests. */
#include "gpushare/driver_types.h"
#include "mock_check.h"

int main(void)
{
    KV("cu_init", "%d", cuInit(0));
    int count = -1;
    KV("cu_device_count_rc", "%d", cuDeviceGetCount(&count));
    KV("nvml_init", "%d", nvmlInit_v2());
    return 0;
}
