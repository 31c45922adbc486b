/*
 * Finding the real driver and NVML entry points.
 *
 * The real dlsym comes from glibc through dlvsym (which we do not override), so it is usable
 * from the very first call, even from inside a sanitizer runtime's start-up. The driver is
 * opened with dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL); looking symbols up in that
 * handle returns the driver's own definitions, never our interposed exports.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gpushare.h"


static _Atomic(gs_dlsym_fn) real_dlsym_ptr;

GS_NO_SANITIZE gs_dlsym_fn gs_real_dlsym_fn(void) {
    gs_dlsym_fn fn = atomic_load_explicit(&real_dlsym_ptr, memory_order_acquire);
    if (fn == NULL) {
        /* Idempotent: concurrent callers store the same value. */
        fn = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (fn == NULL) {
            fn = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        }
        if (fn == NULL) {
            return NULL;
        }
        atomic_store_explicit(&real_dlsym_ptr, fn, memory_order_release);
    }
    return fn;
}

void *gs_real_dlsym(void *handle, const char *symbol) {
    gs_dlsym_fn fn = gs_real_dlsym_fn();
    return fn != NULL ? fn(handle, symbol) : NULL;
}

/* initial-exec: no __tls_get_addr call, which a sanitizer runtime intercepts and which is not
 * usable yet when that runtime's start-up calls our dlsym. */
static _Thread_local int init_depth __attribute__((tls_model("initial-exec")));

GS_NO_SANITIZE int gs_in_init(void) { return init_depth > 0; }
void gs_enter_init(void) { init_depth++; }
void gs_leave_init(void) { init_depth--; }

#define GS_NAME(name) #name,
static const char *const cuda_names[GS_CUDA_FN_COUNT] = {GS_CUDA_HOOKS(GS_NAME)
                                                             GS_CUDA_AUX(GS_NAME)};
static const char *const nvml_names[GS_NVML_FN_COUNT] = {GS_NVML_HOOKS(GS_NAME)
                                                             GS_NVML_AUX(GS_NAME)};
#undef GS_NAME

const char *gs_cuda_fn_name(enum gs_cuda_fn fn) {
    return (fn >= 0 && fn < GS_CUDA_FN_COUNT) ? cuda_names[fn] : "?";
}

struct gs_lib {
    pthread_once_t once;
    const char *soname;
    const char *const *names;
    int count;
    int loaded;
    void **fns;
};

static void *cuda_fns[GS_CUDA_FN_COUNT];
static void *nvml_fns[GS_NVML_FN_COUNT];
static struct gs_lib cuda_lib = {PTHREAD_ONCE_INIT, "libcuda.so.1", cuda_names,
                                 GS_CUDA_FN_COUNT, 0, cuda_fns};
static struct gs_lib nvml_lib = {PTHREAD_ONCE_INIT, "libnvidia-ml.so.1", nvml_names,
                                 GS_NVML_FN_COUNT, 0, nvml_fns};

static void lib_load(struct gs_lib *lib) {
    gs_enter_init();
    void *handle = dlopen(lib->soname, RTLD_NOW | RTLD_GLOBAL);
    if (handle != NULL) {
        for (int i = 0; i < lib->count; i++) {
            lib->fns[i] = gs_real_dlsym(handle, lib->names[i]);
        }
        lib->loaded = 1;
    }
    gs_leave_init();
}

static void cuda_once(void) { lib_load(&cuda_lib); }
static void nvml_once(void) { lib_load(&nvml_lib); }

int gs_real_cuda_load(void) {
    if (pthread_once(&cuda_lib.once, cuda_once) != 0) {
        return -1;
    }
    return cuda_lib.loaded ? 0 : -1;
}

int gs_real_nvml_load(void) {
    if (pthread_once(&nvml_lib.once, nvml_once) != 0) {
        return -1;
    }
    return nvml_lib.loaded ? 0 : -1;
}

void *gs_real_cuda(enum gs_cuda_fn fn) {
    if (fn < 0 || fn >= GS_CUDA_FN_COUNT || gs_real_cuda_load() != 0) {
        return NULL;
    }
    return cuda_fns[fn];
}

void *gs_real_nvml(enum gs_nvml_fn fn) {
    if (fn < 0 || fn >= GS_NVML_FN_COUNT || gs_real_nvml_load() != 0) {
        return NULL;
    }
    return nvml_fns[fn];
}
