/*
 * mock_node: the mock NVML's discovery and health calls (what the device plugin uses).
 *   mock_node                 prints driver version, PCI, NUMA, NVLink per device; checks the
 *                             event calls in-process (inject, wait, timeout, free)
 *   mock_node inject I XID    queues Xid XID on device I (for another process to see)
 *   mock_node pending I 0|1   sets or clears device I's pending page retirement
 *   mock_node wait MS         registers for Xids on every device, prints "ready", then waits up
 *                             to MS ms for one event and prints it (event_device, event_xid)
 */
#include "gpushare/driver_types.h"
#include "mock_check.h"

#include <string.h>

static int inject(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    EXPECT(gpushareMockInjectXid((unsigned int)atoi(argv[2]), strtoull(argv[3], NULL, 10)),
           NVML_SUCCESS);
    return mock_failures ? 1 : 0;
}

static int pending(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    EXPECT(gpushareMockSetRetirementPending((unsigned int)atoi(argv[2]), atoi(argv[3])),
           NVML_SUCCESS);
    return mock_failures ? 1 : 0;
}

static int wait_event(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    unsigned int count = 0;
    nvmlEventSet_t set = NULL;
    nvmlEventData_t data;
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    EXPECT(nvmlEventSetCreate(&set), NVML_SUCCESS);
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t device = NULL;
        EXPECT(nvmlDeviceGetHandleByIndex_v2(i, &device), NVML_SUCCESS);
        EXPECT(nvmlDeviceRegisterEvents(device, nvmlEventTypeXidCriticalError, set),
               NVML_SUCCESS);
    }
    if (mock_failures)
        return 1;
    printf("ready\n");
    (void)fflush(stdout);
    nvmlReturn_t rc = nvmlEventSetWait_v2(set, &data, (unsigned int)atoi(argv[2]));
    KV("event_result", "%d", rc);
    if (rc == NVML_SUCCESS) {
        unsigned int index = 0;
        EXPECT(nvmlDeviceGetIndex(data.device, &index), NVML_SUCCESS);
        KV("event_device", "%u", index);
        KV("event_xid", "%llu", data.eventData);
    }
    EXPECT(nvmlEventSetFree(set), NVML_SUCCESS);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    return mock_failures ? 1 : 0;
}

static void describe(unsigned int i)
{
    char key[64];
    nvmlDevice_t device = NULL;
    nvmlPciInfo_t pci;
    int numa = -1;
    EXPECT(nvmlDeviceGetHandleByIndex_v2(i, &device), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetPciInfo_v3(device, &pci), NVML_SUCCESS);
    snprintf(key, sizeof key, "device%u_bus_id", i);
    KV(key, "%s", pci.busId);
    nvmlReturn_t rc = nvmlDeviceGetNumaNodeId(device, &numa);
    snprintf(key, sizeof key, "device%u_numa", i);
    if (rc == NVML_SUCCESS)
        KV(key, "%d", numa);
    else
        KV(key, "error%d", rc);
    printf("device%u_nvlink=", i);
    for (unsigned int link = 0; link < NVML_NVLINK_MAX_LINKS; link++) {
        nvmlEnableState_t active = NVML_FEATURE_DISABLED;
        rc = nvmlDeviceGetNvLinkState(device, link, &active);
        if (rc != NVML_SUCCESS) {
            printf("error%d", rc);
            break;
        }
        if (active != NVML_FEATURE_ENABLED)
            continue;
        nvmlPciInfo_t remote;
        EXPECT(nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &remote), NVML_SUCCESS);
        printf("%s%s", link ? "," : "", remote.busId);
    }
    printf("\n");
}

static int overview(void)
{
    char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char tiny[2];
    unsigned int count = 0;
    EXPECT(nvmlSystemGetDriverVersion(version, sizeof version), NVML_ERROR_UNINITIALIZED);
    EXPECT(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT(nvmlSystemGetDriverVersion(version, sizeof version), NVML_SUCCESS);
    EXPECT(nvmlSystemGetDriverVersion(tiny, sizeof tiny), NVML_ERROR_INSUFFICIENT_SIZE);
    KV("driver_version", "%s", version);
    EXPECT(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    for (unsigned int i = 0; i < count; i++)
        describe(i);

    /* Events: supported types, registration, an Xid from before registration is not seen,
     * one after it is, a quiet wait times out, an unsupported type is refused. */
    nvmlDevice_t device = NULL;
    nvmlEventSet_t set = NULL;
    nvmlEventData_t data;
    unsigned long long types = 0;
    nvmlEnableState_t pending_state = NVML_FEATURE_ENABLED;
    EXPECT(nvmlDeviceGetHandleByIndex_v2(count - 1, &device), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetSupportedEventTypes(device, &types), NVML_SUCCESS);
    KV("supported_events", "%llu", types);
    EXPECT(gpushareMockInjectXid(count - 1, 31), NVML_SUCCESS); /* before registration */
    EXPECT(nvmlEventSetCreate(&set), NVML_SUCCESS);
    EXPECT(nvmlDeviceRegisterEvents(device, nvmlEventTypeDoubleBitEccError, set),
           NVML_ERROR_NOT_SUPPORTED);
    EXPECT(nvmlDeviceRegisterEvents(device, nvmlEventTypeXidCriticalError, set), NVML_SUCCESS);
    EXPECT(nvmlEventSetWait_v2(set, &data, 20), NVML_ERROR_TIMEOUT);
    EXPECT(gpushareMockInjectXid(count - 1, 79), NVML_SUCCESS);
    EXPECT(gpushareMockInjectXid(count - 1, 48), NVML_SUCCESS);
    EXPECT(nvmlEventSetWait_v2(set, &data, 1000), NVML_SUCCESS);
    EXPECT_TRUE(data.device == device);
    KV("first_xid", "%llu", data.eventData);
    KV("first_type", "%llu", data.eventType);
    EXPECT(nvmlEventSetWait_v2(set, &data, 1000), NVML_SUCCESS);
    KV("second_xid", "%llu", data.eventData);
    EXPECT(nvmlEventSetWait_v2(set, &data, 0), NVML_ERROR_TIMEOUT);
    EXPECT(gpushareMockInjectXid(count, 79), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT(nvmlEventSetFree(set), NVML_SUCCESS);

    EXPECT(nvmlDeviceGetRetiredPagesPendingStatus(device, &pending_state), NVML_SUCCESS);
    KV("pending_before", "%d", (int)pending_state);
    EXPECT(gpushareMockSetRetirementPending(count - 1, 1), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetRetiredPagesPendingStatus(device, &pending_state), NVML_SUCCESS);
    KV("pending_set", "%d", (int)pending_state);
    EXPECT(gpushareMockSetRetirementPending(count - 1, 0), NVML_SUCCESS);
    EXPECT(nvmlDeviceGetRetiredPagesPendingStatus(device, &pending_state), NVML_SUCCESS);
    KV("pending_cleared", "%d", (int)pending_state);
    EXPECT(nvmlShutdown(), NVML_SUCCESS);
    KV("failures", "%d", mock_failures);
    return mock_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "inject") == 0)
        return inject(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "pending") == 0)
        return pending(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "wait") == 0)
        return wait_event(argc, argv);
    return overview();
}
