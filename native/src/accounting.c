/*
 * Per-device usage: initialisation (config + shared state, once), reservations against the
 * limit, and the process-local table of what each live allocation was charged, so that a free
 * gives back exactly what its allocation took.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpushare.h"

/* ---- initialisation -------------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static struct gs_config config;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;
static int state_open;

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);

static void do_init(void) {
    gs_enter_init();
    if (gs_config_load(&config) != 0) {
        init_result = CUDA_ERROR_NOT_INITIALIZED;
        gs_leave_init();
        return;
    }
    int any_limit = 0;
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        any_limit |= gs_config_limit(&config, d) != 0;
    }
    if (any_limit || config.core_limit_percent != 0) {
        if (gs_state_open(&config) != 0) {
            init_result = CUDA_ERROR_NOT_INITIALIZED;
            gs_leave_init();
            return;
        }
        state_open = 1;
    }
    if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) {
        fprintf(stderr, "gpushare: pthread_atfork failed; refusing GPU allocations\n");
        init_result = CUDA_ERROR_NOT_INITIALIZED;
        gs_leave_init();
        return;
    }
    gs_limiter_start(config.core_limit_percent);
    init_result = CUDA_SUCCESS;
    gs_leave_init();
}

CUresult gs_init(void) {
    if (pthread_once(&init_once, do_init) != 0) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    return init_result;
}

uint64_t gs_limit(int device) { return gs_config_limit(&config, device); }
uint64_t gs_ctx_overhead(void) {
    return gs_init() == CUDA_SUCCESS ? config.ctx_overhead : 0; /* needs the config loaded */
}
const struct gs_config *gs_get_config(void) { return &config; }

__attribute__((destructor)) static void gs_fini(void) {
    if (state_open) {
        gs_state_release_slot();
    }
}

/* ---- reservations ---------------------------------------------------------------------- */

static void refuse(int device, uint64_t bytes, uint64_t limit) {
    char want[32], used[32], max[32];
    gs_state_count_refusal();
    gs_format_bytes(bytes, want, sizeof want);
    gs_format_bytes(gs_state_used(device), used, sizeof used);
    gs_format_bytes(limit, max, sizeof max);
    fprintf(stderr, "gpushare: GPU %d: allocation of %s refused: %s of %s limit in use\n", device,
            want, used, max);
    if (config.oom_policy == GS_OOM_EXIT) {
        (void)fflush(stderr);
        gs_state_release_slot();
        _exit(GS_OOM_EXIT_STATUS);
    }
}

CUresult gs_reserve(int device, uint64_t bytes, uint64_t *charged) {
    *charged = 0;
    CUresult rc = gs_init();
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    uint64_t limit = gs_limit(device);
    if (limit == 0 || bytes == 0) {
        return CUDA_SUCCESS; /* no limit for this device: pass through, untracked */
    }
    if (gs_state_reserve(device, bytes, limit) == 0 ||
        (gs_state_reclaim() > 0 && gs_state_reserve(device, bytes, limit) == 0)) {
        *charged = bytes;
        return CUDA_SUCCESS;
    }
    refuse(device, bytes, limit);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void gs_unreserve(int device, uint64_t charged) {
    if (charged != 0) {
        gs_state_release(device, charged);
    }
}

int gs_current_device(void) {
    typedef CUresult (*fn_t)(CUdevice *);
    fn_t fn = (fn_t)gs_real_cuda(GS_FN_cuCtxGetDevice);
    CUdevice device = -1;
    if (fn == NULL || fn(&device) != CUDA_SUCCESS) {
        return -1;
    }
    return device;
}

/* ---- allocation table ------------------------------------------------------------------ */

#define TABLE_BUCKETS 4096u

struct entry {
    struct entry *next;
    uint64_t key;
    uint64_t bytes;
    int kind;
    int device;
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table[TABLE_BUCKETS];

static unsigned bucket_of(enum gs_kind kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 52) & (TABLE_BUCKETS - 1);
}

static void lock_table(void) {
    if (pthread_mutex_lock(&table_lock) != 0) {
        abort(); /* only on a corrupted mutex: never continue unprotected */
    }
}

static void unlock_table(void) {
    if (pthread_mutex_unlock(&table_lock) != 0) {
        abort();
    }
}

int gs_remember(enum gs_kind kind, uint64_t key, int device, uint64_t charged) {
    if (charged == 0) {
        return 0;
    }
    struct entry *e = malloc(sizeof *e);
    if (e == NULL) {
        return -1;
    }
    e->key = key;
    e->kind = (int)kind;
    e->device = device;
    e->bytes = charged;
    unsigned b = bucket_of(kind, key);
    lock_table();
    e->next = table[b];
    table[b] = e;
    unlock_table();
    return 0;
}

int gs_take(enum gs_kind kind, uint64_t key, int *device, uint64_t *charged) {
    unsigned b = bucket_of(kind, key);
    struct entry *found = NULL;
    lock_table();
    for (struct entry **p = &table[b]; *p != NULL; p = &(*p)->next) {
        if ((*p)->key == key && (*p)->kind == (int)kind) {
            found = *p;
            *p = found->next;
            break;
        }
    }
    unlock_table();
    if (found == NULL) {
        return -1;
    }
    *device = found->device;
    *charged = found->bytes;
    free(found);
    return 0;
}

/* Primary contexts: charged once per device while this process holds a reference. */
static int primary_refs[GS_MAX_DEVICES];

int gs_primary_ref(int device, int delta) {
    if (device < 0 || device >= GS_MAX_DEVICES) {
        return -1;
    }
    lock_table();
    int before = primary_refs[device];
    if (before + delta >= 0) {
        primary_refs[device] = before + delta;
    }
    unlock_table();
    return before;
}

/* ---- fork ------------------------------------------------------------------------------- */

static void fork_prepare(void) {
    gs_pool_fork_prepare();
    lock_table();
}

static void fork_parent(void) {
    unlock_table();
    gs_pool_fork_parent();
}

static void fork_child(void) {
    /* The parent's allocations are the parent's: forget them, and take a slot of our own. */
    for (unsigned b = 0; b < TABLE_BUCKETS; b++) {
        struct entry *e = table[b];
        table[b] = NULL;
        while (e != NULL) {
            struct entry *next = e->next;
            free(e);
            e = next;
        }
    }
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        primary_refs[d] = 0;
    }
    unlock_table();
    gs_pool_fork_child();
    gs_limiter_fork_child();
    if (state_open && gs_state_reclaim_slot_after_fork() != 0) {
        fprintf(stderr, "gpushare: no free process slot after fork; refusing GPU allocations\n");
        init_result = CUDA_ERROR_NOT_INITIALIZED;
    }
}
