/*
 * Mock NVML: what a device plugin asks of a node's GPUs. Discovery (driver version, PCI
 * address, NUMA node, NVLink peers) comes from the config; health events (Xid errors) and
 * pending page retirements from the shared state file, where any process can inject them with
 * gpushareMockInjectXid / gpushareMockSetRetirementPending (docs/mock.md).
 */
#include "gpushare/driver_types.h"
#include "mock.h"
#include "nvml_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SUPPORTED_EVENTS nvmlEventTypeXidCriticalError
#define WAIT_STEP_NS 1000000ull /* how often a waiting event set looks for new Xids */

struct nvmlEventSet_st {
    pthread_mutex_t lock;
    unsigned long long types[MOCK_MAX_DEVICES]; /* registered event types, per device */
    uint64_t seen[MOCK_MAX_DEVICES];            /* Xids of the device already delivered */
    int next;                                   /* where the next scan starts (fairness) */
};

MOCK_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = mock_nvml_check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    const char *text = mock_cfg()->nvml_driver_version;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(version, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

static void fill_pci(int index, nvmlPciInfo_t *pci)
{
    const struct mock_device_config *device = &mock_cfg()->devices[index];
    memset(pci, 0, sizeof *pci);
    pci->domain = device->pci_domain;
    pci->bus = device->pci_bus;
    pci->device = device->pci_device;
    pci->pciDeviceId = 0x233510DEu; /* device id << 16 | NVIDIA's vendor id */
    pci->pciSubSystemId = 0x18D910DEu;
    (void)snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", device->pci_domain,
                   device->pci_bus, device->pci_device);
    (void)snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0",
                   device->pci_domain & 0xFFFFu, device->pci_bus, device->pci_device);
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    int i = 0;
    nvmlReturn_t rc = mock_nvml_check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(i, pci);
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, int *node)
{
    int i = 0;
    nvmlReturn_t rc = mock_nvml_check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (mock_cfg()->devices[i].numa < 0)
        return NVML_ERROR_NOT_SUPPORTED; /* as on a machine without NUMA affinity */
    *node = mock_cfg()->devices[i].numa;
    return NVML_SUCCESS;
}

/* The device index behind `link` of `device`, or an NVML error for a link it does not have. */
static nvmlReturn_t link_peer(nvmlDevice_t device, unsigned int link, int *peer, bool *active)
{
    int i = 0;
    nvmlReturn_t rc = mock_nvml_check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct mock_device_config *config = &mock_cfg()->devices[i];
    if (config->nvlink_count == 0)
        return NVML_ERROR_NOT_SUPPORTED; /* no NVLink on this GPU */
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = link < (unsigned int)config->nvlink_count;
    *peer = *active ? config->nvlink_peers[link] : -1;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                  nvmlEnableState_t *active)
{
    int peer = -1;
    bool is_active = false;
    nvmlReturn_t rc = link_peer(device, link, &peer, &is_active);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!active)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = is_active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device,
                                                             unsigned int link, nvmlPciInfo_t *pci)
{
    int peer = -1;
    bool is_active = false;
    nvmlReturn_t rc = link_peer(device, link, &peer, &is_active);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_active)
        return NVML_ERROR_NOT_SUPPORTED; /* the link is down: no remote end */
    fill_pci(peer, pci);
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                                nvmlEnableState_t *pending)
{
    int i = 0;
    nvmlReturn_t rc = mock_nvml_check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *pending = atomic_load(&mock_health(i)->retirement_pending) ? NVML_FEATURE_ENABLED
                                                                  : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- events ---------------------------------------------------------------------------- */

MOCK_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    nvmlReturn_t rc = mock_nvml_check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *created = calloc(1, sizeof *created);
    if (!created)
        return NVML_ERROR_UNKNOWN;
    if (pthread_mutex_init(&created->lock, NULL) != 0) {
        free(created);
        return NVML_ERROR_UNKNOWN;
    }
    *set = created;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                          unsigned long long *event_types)
{
    int i = 0;
    nvmlReturn_t rc = mock_nvml_check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!event_types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *event_types = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device,
                                                  unsigned long long event_types,
                                                  nvmlEventSet_t set)
{
    int i = 0;
    nvmlReturn_t rc = mock_nvml_check_device(device, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (event_types & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    if (pthread_mutex_lock(&set->lock) != 0)
        return NVML_ERROR_UNKNOWN;
    if (set->types[i] == 0) /* Xids from before the registration are not delivered */
        set->seen[i] = atomic_load(&mock_health(i)->xid_count);
    set->types[i] |= event_types;
    (void)pthread_mutex_unlock(&set->lock);
    return NVML_SUCCESS;
}

/* Takes the oldest undelivered Xid of any registered device into *data; false if none. */
static bool take_event(nvmlEventSet_t set, nvmlEventData_t *data)
{
    int count = mock_cfg()->device_count;
    for (int step = 0; step < count; step++) {
        int i = (set->next + step) % count;
        if (!(set->types[i] & nvmlEventTypeXidCriticalError))
            continue;
        struct mock_device_health *health = mock_health(i);
        uint64_t injected = atomic_load(&health->xid_count);
        if (injected == set->seen[i])
            continue;
        if (injected - set->seen[i] > MOCK_MAX_XIDS) /* overwritten: skip to the oldest kept */
            set->seen[i] = injected - MOCK_MAX_XIDS;
        uint64_t xid = atomic_load(&health->xids[set->seen[i] % MOCK_MAX_XIDS]);
        set->seen[i]++;
        set->next = (i + 1) % count;
        memset(data, 0, sizeof *data);
        data->device = mock_nvml_handle(i);
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = xid;
        data->gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
        data->computeInstanceId = 0xFFFFFFFFu;
        return true;
    }
    return false;
}

MOCK_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                             unsigned int timeout_ms)
{
    nvmlReturn_t rc = mock_nvml_check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t deadline = mock_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        if (pthread_mutex_lock(&set->lock) != 0)
            return NVML_ERROR_UNKNOWN;
        bool found = take_event(set, data);
        (void)pthread_mutex_unlock(&set->lock);
        if (found)
            return NVML_SUCCESS;
        uint64_t now = mock_now_ns();
        if (now >= deadline)
            return NVML_ERROR_TIMEOUT;
        uint64_t step = deadline - now < WAIT_STEP_NS ? deadline - now : WAIT_STEP_NS;
        mock_sleep_until_ns(now + step);
    }
}

MOCK_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t rc = mock_nvml_check_init();
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (pthread_mutex_destroy(&set->lock) != 0)
        return NVML_ERROR_UNKNOWN;
    free(set);
    return NVML_SUCCESS;
}

/* ---- mock-only injection --------------------------------------------------------------- */

static nvmlReturn_t health_of(unsigned int index, struct mock_device_health **health)
{
    if (mock_setup("nvml") != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (index >= (unsigned int)mock_cfg()->device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *health = mock_health((int)index);
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t gpushareMockInjectXid(unsigned int index, unsigned long long xid)
{
    struct mock_device_health *health = NULL;
    nvmlReturn_t rc = health_of(index, &health);
    if (rc != NVML_SUCCESS)
        return rc;
    if (mock_shared_lock() != 0)
        return NVML_ERROR_UNKNOWN;
    uint64_t injected = atomic_load(&health->xid_count);
    atomic_store(&health->xids[injected % MOCK_MAX_XIDS], (uint64_t)xid);
    atomic_store(&health->xid_count, injected + 1); /* publishes the Xid written above */
    mock_shared_unlock();
    return NVML_SUCCESS;
}

MOCK_EXPORT nvmlReturn_t gpushareMockSetRetirementPending(unsigned int index, int pending)
{
    struct mock_device_health *health = NULL;
    nvmlReturn_t rc = health_of(index, &health);
    if (rc != NVML_SUCCESS)
        return rc;
    atomic_store(&health->retirement_pending, pending ? 1u : 0u);
    return NVML_SUCCESS;
}
