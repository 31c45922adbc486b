/*
 * Mock CUDA driver: the process-local lock, the initialisation flag, the handle registry and the
 * allocation table that the other mock/cuda_*.c files share.
 */
#include "cuda_internal.h"

#include <pthread.h>
#include <stdlib.h>

#define HANDLE_BUCKETS 256u
#define ALLOC_BUCKETS 4096u

struct handle_entry {
    const void *handle;
    enum mock_handle_type type;
    struct handle_entry *next;
};

static pthread_mutex_t g_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static struct handle_entry *g_handles[HANDLE_BUCKETS];
static struct mock_alloc *g_allocs[ALLOC_BUCKETS];
static uint64_t g_next_address = 0x7f4000000000ull;
/* Legacy allocations come from [256 MiB, 4 GiB) and, like all mock addresses, are not reused. */
static uint64_t g_next_low_address = 0x10000000ull;
#define MOCK_LOW_ADDRESS_END 0x100000000ull

int mock_cuda_lock(void)
{
    return pthread_mutex_lock(&g_cuda_lock) == 0 ? 0 : -1;
}

void mock_cuda_unlock(void)
{
    (void)pthread_mutex_unlock(&g_cuda_lock);
}

bool mock_valid_device(CUdevice device)
{
    return device >= 0 && device < mock_cfg()->device_count;
}

/* ---- handles ----------------------------------------------------------------------------- */

static unsigned int handle_bucket(const void *handle)
{
    uintptr_t value = (uintptr_t)handle;
    return (unsigned int)((value >> 4) ^ (value >> 12)) % HANDLE_BUCKETS;
}

CUresult mock_handle_add(void *handle, enum mock_handle_type type)
{
    struct handle_entry *entry = malloc(sizeof *entry);
    if (!entry)
        return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned int bucket = handle_bucket(handle);
    entry->handle = handle;
    entry->type = type;
    entry->next = g_handles[bucket];
    g_handles[bucket] = entry;
    return CUDA_SUCCESS;
}

bool mock_handle_live(const void *handle, enum mock_handle_type type)
{
    if (!handle)
        return false;
    for (const struct handle_entry *e = g_handles[handle_bucket(handle)]; e; e = e->next)
        if (e->handle == handle)
            return e->type == type;
    return false;
}

void mock_handle_remove(const void *handle)
{
    struct handle_entry **link = &g_handles[handle_bucket(handle)];
    while (*link) {
        if ((*link)->handle == handle) {
            struct handle_entry *dead = *link;
            *link = dead->next;
            free(dead);
            return;
        }
        link = &(*link)->next;
    }
}

/* ---- allocations --------------------------------------------------------------------------- */

static unsigned int alloc_bucket(uint64_t address)
{
    return (unsigned int)((address >> 9) % ALLOC_BUCKETS);
}

uint64_t mock_next_address(uint64_t bytes)
{
    uint64_t step = (bytes + MOCK_PITCH_ALIGNMENT - 1) / MOCK_PITCH_ALIGNMENT * MOCK_PITCH_ALIGNMENT;
    if (step == 0)
        step = MOCK_PITCH_ALIGNMENT;
    uint64_t address = g_next_address;
    g_next_address += step;
    return address;
}

uint64_t mock_next_low_address(uint64_t bytes)
{
    if (bytes >= MOCK_LOW_ADDRESS_END)
        return 0;
    uint64_t step =
        (bytes + MOCK_PITCH_ALIGNMENT - 1) / MOCK_PITCH_ALIGNMENT * MOCK_PITCH_ALIGNMENT;
    if (step == 0)
        step = MOCK_PITCH_ALIGNMENT;
    if (step > MOCK_LOW_ADDRESS_END - g_next_low_address)
        return 0;
    uint64_t address = g_next_low_address;
    g_next_low_address += step;
    return address;
}

CUresult mock_alloc_insert(const struct mock_alloc *alloc)
{
    struct mock_alloc *copy = malloc(sizeof *copy);
    if (!copy)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *copy = *alloc;
    unsigned int bucket = alloc_bucket(alloc->address);
    copy->next = g_allocs[bucket];
    g_allocs[bucket] = copy;
    return CUDA_SUCCESS;
}

struct mock_alloc *mock_alloc_find(uint64_t address)
{
    for (struct mock_alloc *a = g_allocs[alloc_bucket(address)]; a; a = a->next)
        if (a->address == address)
            return a;
    return NULL;
}

void mock_alloc_erase(uint64_t address)
{
    struct mock_alloc **link = &g_allocs[alloc_bucket(address)];
    while (*link) {
        if ((*link)->address == address) {
            struct mock_alloc *dead = *link;
            *link = dead->next;
            free(dead);
            return;
        }
        link = &(*link)->next;
    }
}

void mock_alloc_free_context_locked(const struct mock_context *context)
{
    for (unsigned int b = 0; b < ALLOC_BUCKETS; b++) {
        struct mock_alloc **link = &g_allocs[b];
        while (*link) {
            struct mock_alloc *alloc = *link;
            if (alloc->context == context) {
                mock_uncharge_locked(alloc->device, alloc->bytes);
                *link = alloc->next;
                free(alloc);
            } else {
                link = &alloc->next;
            }
        }
    }
}

CUresult mock_charge(int device, uint64_t bytes)
{
    if (mock_shared_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    bool fits = mock_charge_locked(device, bytes);
    mock_shared_unlock();
    return fits ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

void mock_uncharge(int device, uint64_t bytes)
{
    if (bytes == 0 || mock_shared_lock() != 0)
        return;
    mock_uncharge_locked(device, bytes);
    mock_shared_unlock();
}

/* At exit this process's records go at once, instead of when someone finds the pid dead. */
__attribute__((destructor)) static void mock_cuda_fini(void)
{
    if (mock_check_init() != CUDA_SUCCESS || mock_shared_lock() != 0)
        return;
    mock_release_own_locked();
    mock_shared_unlock();
}
