/*
 * The exported overrides: the hooked driver and NVML entry points, dlsym, and cuGetProcAddress.
 *
 * Programs reach the driver three ways and each is covered:
 *   - direct linking: these exports interpose the driver's (LD_PRELOAD / ld.so.preload);
 *   - dlopen + dlsym: our dlsym hands back our hook for a hooked name, whatever the handle;
 *   - cuGetProcAddress(_v2): the real driver resolves the name for the requested version and
 *     flags, and when the pointer it returns is the real address of a hooked function, the
 *     caller gets our hook instead. Comparing addresses (rather than parsing names and
 *     versions) maps "cuMemAlloc"@12000 to cuMemAlloc_v2 and the _ptsz/_ptds variants under
 *     the per-thread flag exactly as the driver does. Anything else passes through untouched.
 */
#include <dlfcn.h>
#include <stddef.h>

#include "gpushare.h"

#define REAL(name) ((__typeof__(&name))gs_real_cuda(GS_FN_##name))
#define REAL_NVML(name) ((__typeof__(&name))gs_real_nvml(GS_FN_##name))
#define MISSING_REAL CUDA_ERROR_NOT_FOUND

/* ---- the hook table -------------------------------------------------------------------- */

struct hook {
    const char *name;
    void *hook;
};

#define GS_HOOK_ENTRY(name) {#name, (void *)name},
static const struct hook cuda_hooks[GS_CUDA_HOOK_COUNT] = {GS_CUDA_HOOKS(GS_HOOK_ENTRY)};
static const struct hook nvml_hooks[GS_NVML_HOOK_COUNT] = {GS_NVML_HOOKS(GS_HOOK_ENTRY)};
#undef GS_HOOK_ENTRY

/* Plain comparison: dlsym can be called from a sanitizer runtime before it is initialised. */
GS_NO_SANITIZE static int same_name(const char *a, const char *b) {
    while (*a != '\0' && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

/* ---- memory ---------------------------------------------------------------------------- */

static void finish(CUresult rc, enum gs_kind kind, uint64_t key, int device, uint64_t charged) {
    if (rc == CUDA_SUCCESS) {
        (void)gs_remember(kind, key, device, charged);
    } else {
        gs_unreserve(device, charged);
    }
}

/* Free-like calls: take the entry out first (so a concurrent allocation that gets the same
 * address cannot collide with it), put it back if the driver refuses the free. */
#define FREE_BODY(kind, key, call)                                                               \
    do {                                                                                         \
        int device_ = -1;                                                                        \
        uint64_t charged_ = 0;                                                                   \
        int known_ = gs_take((kind), (key), &device_, &charged_) == 0;                           \
        CUresult rc_ = (call);                                                                   \
        if (known_) {                                                                            \
            if (rc_ == CUDA_SUCCESS) {                                                           \
                gs_unreserve(device_, charged_);                                                 \
            } else {                                                                             \
                (void)gs_remember((kind), (key), device_, charged_);                             \
            }                                                                                    \
        } else if (rc_ == CUDA_SUCCESS && (kind) == GS_KIND_PTR) {                               \
            gs_pool_settle_all(); /* maybe a pool block: the pool may have shrunk */             \
        }                                                                                        \
        return rc_;                                                                              \
    } while (0)

/* Allocation-like calls: reserve ``bytes`` on ``device`` against the limit (refused: the driver
 * is not called), make the object, then record ``handle`` (read only on success) so that its
 * free gives the bytes back, or give them back at once if the driver failed. */
#define CHARGE_BODY(kind, device, bytes, call, handle)                                           \
    do {                                                                                         \
        int device_ = (device);                                                                  \
        uint64_t charged_;                                                                       \
        CUresult rc_ = gs_reserve(device_, (bytes), &charged_);                                  \
        if (rc_ != CUDA_SUCCESS) {                                                               \
            return rc_;                                                                          \
        }                                                                                        \
        rc_ = (call);                                                                            \
        finish(rc_, (kind), rc_ == CUDA_SUCCESS ? (uint64_t)(handle) : 0, device_, charged_);    \
        return rc_;                                                                              \
    } while (0)

GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *pointer, size_t bytes) {
    __typeof__(&cuMemAlloc_v2) real = REAL(cuMemAlloc_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_PTR, gs_current_device(), bytes, real(pointer, bytes), *pointer);
}

static uint64_t mul_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t add_sat(uint64_t a, uint64_t b) {
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/*
 * A pitched allocation is charged pitch x height as the driver returns it. The pitch is only
 * known afterwards, so an estimate (rows padded to 512 bytes) is reserved first and settled
 * up or down; if the extra is refused the block is freed and OUT_OF_MEMORY returned. The _v2
 * and the legacy entry point differ only in their integer widths, hence the callbacks.
 */
struct pitch_call {
    uint64_t width_bytes, height;
    /* The real allocation, writing the caller's outputs; *pointer, *pitch get their values. */
    CUresult (*alloc)(const struct pitch_call *call, uint64_t *pointer, uint64_t *pitch);
    void (*release)(uint64_t pointer); /* undo a successful alloc */
    void *out_pointer, *out_pitch;
    unsigned int element_size_bytes;
};

static CUresult pitched(const struct pitch_call *call) {
    int device = gs_current_device();
    uint64_t estimate = mul_sat(add_sat(call->width_bytes, 511) & ~(uint64_t)511, call->height);
    uint64_t charged;
    CUresult rc = gs_reserve(device, estimate, &charged);
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    uint64_t pointer = 0, pitch = 0;
    rc = call->alloc(call, &pointer, &pitch);
    if (rc != CUDA_SUCCESS || charged == 0) {
        finish(rc, GS_KIND_PTR, pointer, device, charged);
        return rc;
    }
    uint64_t actual = mul_sat(pitch, call->height);
    if (actual > charged) {
        uint64_t extra;
        CUresult more = gs_reserve(device, actual - charged, &extra);
        if (more != CUDA_SUCCESS) {
            call->release(pointer);
            gs_unreserve(device, charged);
            return more;
        }
        charged += extra;
    } else if (actual < charged) {
        gs_unreserve(device, charged - actual);
        charged = actual;
    }
    finish(rc, GS_KIND_PTR, pointer, device, charged);
    return rc;
}

static CUresult pitch_alloc_v2(const struct pitch_call *call, uint64_t *pointer, uint64_t *pitch) {
    CUdeviceptr *out_pointer = call->out_pointer;
    size_t *out_pitch = call->out_pitch;
    CUresult rc = REAL(cuMemAllocPitch_v2)(out_pointer, out_pitch, (size_t)call->width_bytes,
                                           (size_t)call->height, call->element_size_bytes);
    if (rc == CUDA_SUCCESS) {
        *pointer = *out_pointer;
        *pitch = *out_pitch;
    }
    return rc;
}

static void pitch_release_v2(uint64_t pointer) {
    __typeof__(&cuMemFree_v2) real_free = REAL(cuMemFree_v2);
    if (real_free != NULL) {
        (void)real_free(pointer); /* best effort: the allocation is refused either way */
    }
}

GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *pointer, size_t *pitch, size_t width_bytes,
                                      size_t height, unsigned int element_size_bytes) {
    if (REAL(cuMemAllocPitch_v2) == NULL) {
        return MISSING_REAL;
    }
    struct pitch_call call = {.width_bytes = width_bytes,
                              .height = height,
                              .alloc = pitch_alloc_v2,
                              .release = pitch_release_v2,
                              .out_pointer = pointer,
                              .out_pitch = pitch,
                              .element_size_bytes = element_size_bytes};
    return pitched(&call);
}

/* ---- legacy (pre-_v2) linear memory: 32-bit device pointers and sizes -------------------- */

/* A legacy pointer is recorded zero-extended, the value the _v2 API would show for it. */
GS_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *pointer, unsigned int bytes) {
    __typeof__(&cuMemAlloc) real = REAL(cuMemAlloc);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_PTR, gs_current_device(), bytes, real(pointer, bytes), *pointer);
}

static CUresult pitch_alloc_v1(const struct pitch_call *call, uint64_t *pointer, uint64_t *pitch) {
    CUdeviceptr_v1 *out_pointer = call->out_pointer;
    unsigned int *out_pitch = call->out_pitch;
    CUresult rc = REAL(cuMemAllocPitch)(out_pointer, out_pitch, (unsigned int)call->width_bytes,
                                        (unsigned int)call->height, call->element_size_bytes);
    if (rc == CUDA_SUCCESS) {
        *pointer = *out_pointer;
        *pitch = *out_pitch;
    }
    return rc;
}

static void pitch_release_v1(uint64_t pointer) {
    __typeof__(&cuMemFree) real_free = REAL(cuMemFree);
    if (real_free != NULL) {
        (void)real_free((CUdeviceptr_v1)pointer); /* best effort, as for _v2 */
    }
}

GS_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *pointer, unsigned int *pitch,
                                   unsigned int width_bytes, unsigned int height,
                                   unsigned int element_size_bytes) {
    if (REAL(cuMemAllocPitch) == NULL) {
        return MISSING_REAL;
    }
    struct pitch_call call = {.width_bytes = width_bytes,
                              .height = height,
                              .alloc = pitch_alloc_v1,
                              .release = pitch_release_v1,
                              .out_pointer = pointer,
                              .out_pitch = pitch,
                              .element_size_bytes = element_size_bytes};
    return pitched(&call);
}

GS_EXPORT CUresult cuMemFree(CUdeviceptr_v1 pointer) {
    __typeof__(&cuMemFree) real = REAL(cuMemFree);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_PTR, pointer, real(pointer));
}

GS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *pointer, size_t bytes, unsigned int flags) {
    __typeof__(&cuMemAllocManaged) real = REAL(cuMemAllocManaged);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_PTR, gs_current_device(), bytes, real(pointer, bytes, flags), *pointer);
}

/* Stream-ordered allocations are charged what their pool reserves (pool.c). */
GS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *pointer, size_t bytes, CUstream stream) {
    return gs_pool_alloc(REAL(cuMemAllocAsync), NULL, REAL(cuMemFreeAsync), pointer, bytes, NULL,
                         stream);
}

GS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *pointer, size_t bytes, CUstream stream) {
    return gs_pool_alloc(REAL(cuMemAllocAsync_ptsz), NULL, REAL(cuMemFreeAsync_ptsz), pointer,
                         bytes, NULL, stream);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *pointer, size_t bytes, CUmemoryPool pool,
                                           CUstream stream) {
    return gs_pool_alloc(NULL, REAL(cuMemAllocFromPoolAsync), REAL(cuMemFreeAsync), pointer,
                         bytes, pool, stream);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *pointer, size_t bytes,
                                                CUmemoryPool pool, CUstream stream) {
    return gs_pool_alloc(NULL, REAL(cuMemAllocFromPoolAsync_ptsz), REAL(cuMemFreeAsync_ptsz),
                         pointer, bytes, pool, stream);
}

/* Pools: remember which device each pool the program learns of belongs to, so that
 * cuMemAllocFromPoolAsync is charged there whatever context is current (pool.c). */
GS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    __typeof__(&cuMemPoolCreate) real = REAL(cuMemPoolCreate);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(pool, props);
    if (rc == CUDA_SUCCESS) {
        /* A host / NUMA pool is not device memory: it passes through uncounted. */
        gs_pool_note_device(*pool, props->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                                       ? props->location.id
                                       : GS_POOL_NOT_DEVICE);
    }
    return rc;
}

GS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    __typeof__(&cuMemPoolDestroy) real = REAL(cuMemPoolDestroy);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(pool);
    if (rc == CUDA_SUCCESS) {
        gs_pool_forget(pool);
    }
    return rc;
}

GS_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice device) {
    __typeof__(&cuDeviceGetMemPool) real = REAL(cuDeviceGetMemPool);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(pool, device);
    if (rc == CUDA_SUCCESS) {
        gs_pool_note_device(*pool, device);
    }
    return rc;
}

GS_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device) {
    __typeof__(&cuDeviceGetDefaultMemPool) real = REAL(cuDeviceGetDefaultMemPool);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(pool, device);
    if (rc == CUDA_SUCCESS) {
        gs_pool_note_device(*pool, device);
    }
    return rc;
}

GS_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep) {
    __typeof__(&cuMemPoolTrimTo) real = REAL(cuMemPoolTrimTo);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(pool, min_bytes_to_keep);
    gs_pool_settle_all();
    return rc;
}

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr pointer) {
    __typeof__(&cuMemFree_v2) real = REAL(cuMemFree_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_PTR, pointer, real(pointer));
}

GS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr pointer, CUstream stream) {
    __typeof__(&cuMemFreeAsync) real = REAL(cuMemFreeAsync);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_PTR, pointer, real(pointer, stream));
}

GS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr pointer, CUstream stream) {
    __typeof__(&cuMemFreeAsync) real = REAL(cuMemFreeAsync_ptsz);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_PTR, pointer, real(pointer, stream));
}

GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                               const CUmemAllocationProp *prop, unsigned long long flags) {
    __typeof__(&cuMemCreate) real = REAL(cuMemCreate);
    if (real == NULL) {
        return MISSING_REAL;
    }
    /* Only device-resident physical memory counts; host / NUMA locations pass through. */
    int device = -1;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        device = prop->location.id;
    }
    CHARGE_BODY(GS_KIND_HANDLE, device, bytes, real(handle, bytes, prop, flags), *handle);
}

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    __typeof__(&cuMemRelease) real = REAL(cuMemRelease);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_HANDLE, handle, real(handle));
}

/* ---- arrays ---------------------------------------------------------------------------- */

#define GS_ARRAY3D_LAYERED 0x01u
#define GS_ARRAY3D_CUBEMAP 0x04u

static uint64_t element_bytes(CUarray_format format, unsigned int channels) {
    uint64_t size;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        size = 1;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        size = 2;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        size = 4;
        break;
    default:
        size = 4; /* formats not declared here: assume 32-bit components */
        break;
    }
    return mul_sat(size, channels == 0 ? 1 : channels);
}

static uint64_t dim(size_t value) { return value == 0 ? 1 : value; }

static uint64_t array2d_bytes(uint64_t width, uint64_t height, CUarray_format format,
                              unsigned int channels) {
    return mul_sat(mul_sat(width, dim(height)), element_bytes(format, channels));
}

GS_EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *descriptor) {
    __typeof__(&cuArrayCreate_v2) real = REAL(cuArrayCreate_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    if (descriptor == NULL) {
        return real(array, descriptor);
    }
    uint64_t bytes = array2d_bytes(descriptor->Width, descriptor->Height, descriptor->Format,
                                   descriptor->NumChannels);
    CHARGE_BODY(GS_KIND_ARRAY, gs_current_device(), bytes,
                real(array, descriptor), (uint64_t)(uintptr_t)*array);
}

static uint64_t array3d_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    uint64_t element = element_bytes(d->Format, d->NumChannels);
    int keep_depth = (d->Flags & (GS_ARRAY3D_LAYERED | GS_ARRAY3D_CUBEMAP)) != 0;
    uint64_t total = 0;
    uint64_t w = dim(d->Width), h = dim(d->Height), depth = dim(d->Depth);
    for (unsigned int level = 0; level < (levels == 0 ? 1 : levels); level++) {
        total = add_sat(total, mul_sat(mul_sat(mul_sat(w, h), depth), element));
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        if (!keep_depth) {
            depth = depth > 1 ? depth / 2 : 1;
        }
        if (level >= 64) {
            break;
        }
    }
    return total;
}

GS_EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *descriptor) {
    __typeof__(&cuArray3DCreate_v2) real = REAL(cuArray3DCreate_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    if (descriptor == NULL) {
        return real(array, descriptor);
    }
    CHARGE_BODY(GS_KIND_ARRAY, gs_current_device(), array3d_bytes(descriptor, 1),
                real(array, descriptor), (uint64_t)(uintptr_t)*array);
}

/* The legacy array entry points: the same charge from the 32-bit descriptors. */
GS_EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *descriptor) {
    __typeof__(&cuArrayCreate) real = REAL(cuArrayCreate);
    if (real == NULL) {
        return MISSING_REAL;
    }
    if (descriptor == NULL) {
        return real(array, descriptor);
    }
    uint64_t bytes = array2d_bytes(descriptor->Width, descriptor->Height, descriptor->Format,
                                   descriptor->NumChannels);
    CHARGE_BODY(GS_KIND_ARRAY, gs_current_device(), bytes,
                real(array, descriptor), (uint64_t)(uintptr_t)*array);
}

GS_EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *descriptor) {
    __typeof__(&cuArray3DCreate) real = REAL(cuArray3DCreate);
    if (real == NULL) {
        return MISSING_REAL;
    }
    if (descriptor == NULL) {
        return real(array, descriptor);
    }
    const CUDA_ARRAY3D_DESCRIPTOR wide = {descriptor->Width,  descriptor->Height,
                                          descriptor->Depth,  descriptor->Format,
                                          descriptor->NumChannels, descriptor->Flags};
    CHARGE_BODY(GS_KIND_ARRAY, gs_current_device(), array3d_bytes(&wide, 1),
                real(array, descriptor), (uint64_t)(uintptr_t)*array);
}

GS_EXPORT CUresult cuArrayDestroy(CUarray array) {
    __typeof__(&cuArrayDestroy) real = REAL(cuArrayDestroy);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_ARRAY, (uint64_t)(uintptr_t)array, real(array));
}

GS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array,
                                          const CUDA_ARRAY3D_DESCRIPTOR *descriptor,
                                          unsigned int levels) {
    __typeof__(&cuMipmappedArrayCreate) real = REAL(cuMipmappedArrayCreate);
    if (real == NULL) {
        return MISSING_REAL;
    }
    if (descriptor == NULL) {
        return real(array, descriptor, levels);
    }
    CHARGE_BODY(GS_KIND_MIPMAP, gs_current_device(), array3d_bytes(descriptor, levels),
                real(array, descriptor, levels), (uint64_t)(uintptr_t)*array);
}

GS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    __typeof__(&cuMipmappedArrayDestroy) real = REAL(cuMipmappedArrayDestroy);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_MIPMAP, (uint64_t)(uintptr_t)array, real(array));
}

/* ---- contexts: a fixed overhead charge ------------------------------------------------- */

/* Every way of creating a context charges the same overhead (reserved before the driver call,
 * rolled back if it fails); every way of destroying one gives back what was recorded. */
GS_EXPORT CUresult cuCtxCreate_v2(CUcontext *context, unsigned int flags, CUdevice device) {
    __typeof__(&cuCtxCreate_v2) real = REAL(cuCtxCreate_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_CTX, device, gs_ctx_overhead(),
                real(context, flags, device), (uintptr_t)*context);
}

GS_EXPORT CUresult cuCtxCreate(CUcontext *context, unsigned int flags, CUdevice device) {
    __typeof__(&cuCtxCreate) real = REAL(cuCtxCreate);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_CTX, device, gs_ctx_overhead(),
                real(context, flags, device), (uintptr_t)*context);
}

/* With execution affinity (an SM-count share): the context still holds its full overhead. */
GS_EXPORT CUresult cuCtxCreate_v3(CUcontext *context, CUexecAffinityParam *params, int count,
                                  unsigned int flags, CUdevice device) {
    __typeof__(&cuCtxCreate_v3) real = REAL(cuCtxCreate_v3);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_CTX, device, gs_ctx_overhead(),
                real(context, params, count, flags, device), (uintptr_t)*context);
}

GS_EXPORT CUresult cuCtxCreate_v4(CUcontext *context, CUctxCreateParams *params,
                                  unsigned int flags, CUdevice device) {
    __typeof__(&cuCtxCreate_v4) real = REAL(cuCtxCreate_v4);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CHARGE_BODY(GS_KIND_CTX, device, gs_ctx_overhead(),
                real(context, params, flags, device), (uintptr_t)*context);
}

GS_EXPORT CUresult cuCtxDestroy_v2(CUcontext context) {
    __typeof__(&cuCtxDestroy_v2) real = REAL(cuCtxDestroy_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_CTX, (uint64_t)(uintptr_t)context, real(context));
}

GS_EXPORT CUresult cuCtxDestroy(CUcontext context) {
    __typeof__(&cuCtxDestroy) real = REAL(cuCtxDestroy);
    if (real == NULL) {
        return MISSING_REAL;
    }
    FREE_BODY(GS_KIND_CTX, (uint64_t)(uintptr_t)context, real(context));
}

static _Atomic uint64_t primary_charged[GS_MAX_DEVICES];

GS_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
    __typeof__(&cuDevicePrimaryCtxRetain) real = REAL(cuDevicePrimaryCtxRetain);
    if (real == NULL) {
        return MISSING_REAL;
    }
    if (device < 0 || device >= GS_MAX_DEVICES) {
        CUresult init = gs_init();
        return init != CUDA_SUCCESS ? init : real(context, device);
    }
    /* The first reference of this process charges the overhead. */
    int before = gs_primary_ref(device, +1);
    uint64_t charged = 0;
    if (before == 0) {
        CUresult rc = gs_reserve(device, gs_ctx_overhead(), &charged);
        if (rc != CUDA_SUCCESS) {
            (void)gs_primary_ref(device, -1);
            return rc;
        }
        atomic_store_explicit(&primary_charged[device], charged, memory_order_relaxed);
    } else if (gs_init() != CUDA_SUCCESS) {
        (void)gs_primary_ref(device, -1);
        return gs_init();
    }
    CUresult rc = real(context, device);
    if (rc != CUDA_SUCCESS) {
        if (gs_primary_ref(device, -1) == 1) {
            gs_unreserve(device, atomic_exchange(&primary_charged[device], 0));
        }
    }
    return rc;
}

/* The last release of the process gives the overhead back. */
static void primary_released(CUresult rc, CUdevice device) {
    if (rc == CUDA_SUCCESS && device >= 0 && device < GS_MAX_DEVICES &&
        gs_primary_ref(device, -1) == 1) {
        gs_unreserve(device, atomic_exchange(&primary_charged[device], 0));
    }
}

GS_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    __typeof__(&cuDevicePrimaryCtxRelease_v2) real = REAL(cuDevicePrimaryCtxRelease_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(device);
    primary_released(rc, device);
    return rc;
}

/* The pre-11.0 name of the same call (cuGetProcAddress hands it out below 11000). */
GS_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
    __typeof__(&cuDevicePrimaryCtxRelease) real = REAL(cuDevicePrimaryCtxRelease);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(device);
    primary_released(rc, device);
    return rc;
}

/* ---- what programs see ----------------------------------------------------------------- */

static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The slice of the current device: total = min(limit, real total), free = total - usage (at
 * least 0) and never more than the real free memory. Unchanged without a limit. */
static void slice_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    if (gs_init() != CUDA_SUCCESS) {
        return;
    }
    int device = gs_current_device();
    uint64_t limit = gs_limit(device);
    if (limit == 0) {
        return;
    }
    uint64_t total = min_u64(limit, *total_bytes);
    uint64_t used = gs_state_used(device);
    uint64_t left = used >= total ? 0 : total - used;
    *total_bytes = total;
    *free_bytes = min_u64(left, *free_bytes);
}

GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    __typeof__(&cuMemGetInfo_v2) real = REAL(cuMemGetInfo_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    size_t real_free = 0, real_total = 0;
    CUresult rc = real(&real_free, &real_total);
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    uint64_t free64 = real_free, total64 = real_total;
    slice_info(&free64, &total64);
    if (free_bytes != NULL) {
        *free_bytes = (size_t)free64;
    }
    if (total_bytes != NULL) {
        *total_bytes = (size_t)total64;
    }
    return rc;
}

/* The legacy queries report 32 bits; like the driver, sizes that do not fit read UINT_MAX. */
static unsigned int clamp_u32(uint64_t value) {
    return value > UINT_MAX ? UINT_MAX : (unsigned int)value;
}

/* The slice is computed from the full sizes (the _v2 query when the driver has it), so a slice
 * that fits in 32 bits is reported exactly even on a GPU whose memory does not. */
GS_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    __typeof__(&cuMemGetInfo) real = REAL(cuMemGetInfo);
    if (real == NULL) {
        return MISSING_REAL;
    }
    __typeof__(&cuMemGetInfo_v2) real_v2 = REAL(cuMemGetInfo_v2);
    uint64_t free64 = 0, total64 = 0;
    CUresult rc;
    if (real_v2 != NULL) {
        size_t f = 0, t = 0;
        rc = real_v2(&f, &t);
        free64 = f;
        total64 = t;
    } else {
        unsigned int f = 0, t = 0;
        rc = real(&f, &t);
        free64 = f;
        total64 = t;
    }
    if (rc != CUDA_SUCCESS) {
        return rc;
    }
    slice_info(&free64, &total64);
    if (free_bytes != NULL) {
        *free_bytes = clamp_u32(free64);
    }
    if (total_bytes != NULL) {
        *total_bytes = clamp_u32(total64);
    }
    return rc;
}

/* min(limit, real total) for a device with a limit; unchanged otherwise. */
static uint64_t slice_total(CUdevice device, uint64_t total) {
    if (gs_init() != CUDA_SUCCESS) {
        return total;
    }
    uint64_t limit = gs_limit(device);
    return limit != 0 ? min_u64(limit, total) : total;
}

GS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    __typeof__(&cuDeviceTotalMem_v2) real = REAL(cuDeviceTotalMem_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(bytes, device);
    if (rc == CUDA_SUCCESS && bytes != NULL) {
        *bytes = (size_t)slice_total(device, *bytes);
    }
    return rc;
}

GS_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice device) {
    __typeof__(&cuDeviceTotalMem) real = REAL(cuDeviceTotalMem);
    if (real == NULL) {
        return MISSING_REAL;
    }
    __typeof__(&cuDeviceTotalMem_v2) real_v2 = REAL(cuDeviceTotalMem_v2);
    if (real_v2 == NULL || bytes == NULL) {
        CUresult rc = real(bytes, device);
        if (rc == CUDA_SUCCESS && bytes != NULL) {
            *bytes = clamp_u32(slice_total(device, *bytes));
        }
        return rc;
    }
    size_t total = 0;
    CUresult rc = real_v2(&total, device);
    if (rc == CUDA_SUCCESS) {
        *bytes = clamp_u32(slice_total(device, total));
    }
    return rc;
}

/* NVML index of a device, or -1. NVML and CUDA indices agree inside a container that sees
 * only its own GPUs (see docs/isolation.md). */
static int nvml_index(nvmlDevice_t device) {
    __typeof__(&nvmlDeviceGetIndex) get_index = REAL_NVML(nvmlDeviceGetIndex);
    unsigned int index = 0;
    if (get_index == NULL || get_index(device, &index) != NVML_SUCCESS ||
        index >= GS_MAX_DEVICES) {
        return -1;
    }
    return (int)index;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    __typeof__(&nvmlDeviceGetMemoryInfo) real = REAL_NVML(nvmlDeviceGetMemoryInfo);
    if (real == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    nvmlReturn_t rc = real(device, memory);
    if (rc == NVML_SUCCESS && memory != NULL && gs_init() == CUDA_SUCCESS) {
        int index = nvml_index(device);
        uint64_t limit = gs_limit(index);
        if (limit != 0) {
            uint64_t total = min_u64(limit, memory->total);
            uint64_t used = min_u64(gs_state_used(index), total);
            memory->total = total;
            memory->used = used;
            memory->free = total - used;
        }
    }
    return rc;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    __typeof__(&nvmlDeviceGetMemoryInfo_v2) real = REAL_NVML(nvmlDeviceGetMemoryInfo_v2);
    if (real == NULL) {
        return NVML_ERROR_UNINITIALIZED;
    }
    nvmlReturn_t rc = real(device, memory);
    if (rc == NVML_SUCCESS && memory != NULL && gs_init() == CUDA_SUCCESS) {
        int index = nvml_index(device);
        uint64_t limit = gs_limit(index);
        if (limit != 0) {
            uint64_t total = min_u64(limit, memory->total);
            uint64_t used = min_u64(gs_state_used(index), total);
            memory->total = total;
            memory->reserved = 0; /* the slice has no driver-reserved part of its own */
            memory->used = used;
            memory->free = total - used;
        }
    }
    return rc;
}

/*
 * The process list. With a memory limit on the device, the container sees its own processes
 * only: those holding a live slot in its state file that are charged something on the device,
 * each with what our accounting charges it (its allocations and context overhead), the same
 * numbers nvmlDeviceGetMemoryInfo adds up. Without a limit (or when the device handle is not
 * valid, or NVML is not initialised) the call passes through. `stride` is the caller's element
 * size: the plain entry point fills the shorter nvmlProcessInfo_v1_t.
 */
#define GS_PASS_THROUGH ((nvmlReturn_t)-1)

/* GS_PASS_THROUGH when the caller must call the real entry point. */
static nvmlReturn_t process_list(nvmlDevice_t device, unsigned int *count, void *infos,
                                 size_t stride) {
    int index = nvml_index(device);
    if (index < 0 || gs_init() != CUDA_SUCCESS || gs_limit(index) == 0) {
        return GS_PASS_THROUGH;
    }
    if (count == NULL || (*count > 0 && infos == NULL)) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    struct gs_state_process found[GS_MAX_PROCESSES];
    unsigned live = gs_state_processes(index, found, GS_MAX_PROCESSES);
    if (live > GS_MAX_PROCESSES) {
        live = GS_MAX_PROCESSES; /* cannot happen: one slot per process */
    }
    if (live > *count) {
        *count = live;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned k = 0; k < live; k++) {
        void *entry = (char *)infos + k * stride;
        if (stride == sizeof(gs_nvmlProcessInfo_v1_t)) {
            gs_nvmlProcessInfo_v1_t *info = entry;
            info->pid = found[k].pid;
            info->usedGpuMemory = found[k].used;
        } else {
            nvmlProcessInfo_t *info = entry;
            info->pid = found[k].pid;
            info->usedGpuMemory = found[k].used;
            info->gpuInstanceId = 0xFFFFFFFFu; /* not a MIG instance */
            info->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *count = live;
    return NVML_SUCCESS;
}

#define PROCESS_LIST_HOOK(name, info_type)                                                       \
    GS_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *count, info_type *infos) {    \
        __typeof__(&name) real = REAL_NVML(name);                                                \
        if (real == NULL) {                                                                      \
            return NVML_ERROR_UNINITIALIZED;                                                     \
        }                                                                                        \
        nvmlReturn_t rc = process_list(device, count, infos, sizeof(info_type));                 \
        return rc == GS_PASS_THROUGH ? real(device, count, infos) : rc;                          \
    }

PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses, gs_nvmlProcessInfo_v1_t)

/* ---- launches: one relaxed load + tail call when there is no compute limit --------------- */

/*
 * Each launch entry point jumps through an atomic pointer. It starts at a resolver that
 * initialises the library and then publishes either the real function (no compute limit:
 * the steady state is one relaxed load and a tail call, no lock) or a limited wrapper.
 */
#define LAUNCH_HOOK(name, kind, params, args)                                                    \
    typedef CUresult (*name##_fn) params;                                                        \
    static CUresult name##_resolve params;                                                       \
    static CUresult name##_limited params;                                                       \
    static _Atomic(name##_fn) name##_target = name##_resolve;                                    \
    GS_EXPORT CUresult name params {                                                             \
        return atomic_load_explicit(&name##_target, memory_order_relaxed) args;                  \
    }                                                                                            \
    static CUresult name##_limited params {                                                      \
        name##_fn real = (name##_fn)gs_real_cuda(GS_FN_##name);                                  \
        if (real == NULL) {                                                                      \
            return MISSING_REAL;                                                                 \
        }                                                                                        \
        gs_limiter_charge(kind);                                                                 \
        return real args;                                                                        \
    }                                                                                            \
    static CUresult name##_resolve params {                                                      \
        name##_fn real = (name##_fn)gs_real_cuda(GS_FN_##name);                                  \
        if (real == NULL) {                                                                      \
            return MISSING_REAL;                                                                 \
        }                                                                                        \
        (void)gs_init();                                                                         \
        name##_fn next = gs_limiter_active() ? name##_limited : real;                            \
        atomic_store_explicit(&name##_target, next, memory_order_relaxed);                       \
        return next args;                                                                        \
    }

#define KERNEL_PARAMS                                                                            \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,           \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,      \
     void **extra)
#define KERNEL_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
#define COOP_PARAMS                                                                              \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,           \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params)
#define COOP_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params)

LAUNCH_HOOK(cuLaunchKernel, GS_LAUNCH_KERNEL, KERNEL_PARAMS, KERNEL_ARGS)
LAUNCH_HOOK(cuLaunchKernel_ptsz, GS_LAUNCH_KERNEL, KERNEL_PARAMS, KERNEL_ARGS)
LAUNCH_HOOK(cuLaunchCooperativeKernel, GS_LAUNCH_KERNEL, COOP_PARAMS, COOP_ARGS)
LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, GS_LAUNCH_KERNEL, COOP_PARAMS, COOP_ARGS)
LAUNCH_HOOK(cuLaunchKernelEx, GS_LAUNCH_KERNEL,
            (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
            (config, f, params, extra))
LAUNCH_HOOK(cuLaunchKernelEx_ptsz, GS_LAUNCH_KERNEL,
            (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
            (config, f, params, extra))
LAUNCH_HOOK(cuGraphLaunch, GS_LAUNCH_GRAPH, (CUgraphExec graph, CUstream stream),
            (graph, stream))
LAUNCH_HOOK(cuGraphLaunch_ptsz, GS_LAUNCH_GRAPH, (CUgraphExec graph, CUstream stream),
            (graph, stream))

/* ---- cuGetProcAddress ------------------------------------------------------------------ */

/* Our hook for a real driver address, or the address itself. */
static void *hook_for_real(void *real) {
    for (int i = 0; i < GS_CUDA_HOOK_COUNT; i++) {
        if (real == cuda_hooks[i].hook) {
            return real; /* the driver already resolved to our export */
        }
        void *candidate = gs_real_cuda((enum gs_cuda_fn)i);
        if (candidate != NULL && candidate == real) {
            return cuda_hooks[i].hook;
        }
    }
    return real;
}

GS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **function, int cuda_version,
                                    cuuint64_t flags) {
    __typeof__(&cuGetProcAddress) real = REAL(cuGetProcAddress);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(symbol, function, cuda_version, flags);
    if (rc == CUDA_SUCCESS && function != NULL && *function != NULL) {
        *function = hook_for_real(*function);
    }
    return rc;
}

GS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **function, int cuda_version,
                                       cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    __typeof__(&cuGetProcAddress_v2) real = REAL(cuGetProcAddress_v2);
    if (real == NULL) {
        return MISSING_REAL;
    }
    CUresult rc = real(symbol, function, cuda_version, flags, status);
    if (rc == CUDA_SUCCESS && function != NULL && *function != NULL) {
        *function = hook_for_real(*function);
    }
    return rc;
}

/* ---- dlsym ----------------------------------------------------------------------------- */

/*
 * dlsym. For a hooked cu* / nvml* name we hand back our hook, whatever the handle. Everything
 * else must behave exactly like glibc's dlsym, including RTLD_NEXT, which glibc resolves
 * relative to the object that *called* dlsym (it looks at its own return address). So on
 * x86-64 the exported dlsym is a small trampoline: it asks gs_dlsym_pre() for a hook and, when
 * there is none, jumps (not calls) into the real dlsym with the caller's arguments and return
 * address untouched. Elsewhere a C version calls the real dlsym, whose RTLD_NEXT then means
 * "after libgpushare" (documented limitation).
 */
GS_NO_SANITIZE static void *null_dlsym(void *handle, const char *symbol) {
    (void)handle;
    (void)symbol;
    return NULL;
}

GS_NO_SANITIZE static void *hook_for_name(const char *symbol) {
    if (symbol == NULL || gs_in_init()) {
        return NULL;
    }
    if (symbol[0] == 'c' && symbol[1] == 'u') {
        for (int i = 0; i < GS_CUDA_HOOK_COUNT; i++) {
            if (same_name(symbol, cuda_hooks[i].name)) {
                return gs_real_cuda((enum gs_cuda_fn)i) != NULL ? cuda_hooks[i].hook : NULL;
            }
        }
    } else if (symbol[0] == 'n' && symbol[1] == 'v' && symbol[2] == 'm' && symbol[3] == 'l') {
        for (int i = 0; i < GS_NVML_HOOK_COUNT; i++) {
            if (same_name(symbol, nvml_hooks[i].name)) {
                return gs_real_nvml((enum gs_nvml_fn)i) != NULL ? nvml_hooks[i].hook : NULL;
            }
        }
    }
    return NULL;
}



/* Hook for symbol, or NULL with *real set to the function to jump to. */
__attribute__((used)) void *gs_dlsym_pre(void *handle, const char *symbol, gs_dlsym_fn *real);
GS_NO_SANITIZE __attribute__((used)) void *gs_dlsym_pre(void *handle, const char *symbol,
                                                         gs_dlsym_fn *real) {
    (void)handle;
    void *hook = hook_for_name(symbol);
    if (hook != NULL) {
        return hook;
    }
    gs_dlsym_fn fn = gs_real_dlsym_fn();
    *real = fn != NULL ? fn : null_dlsym;
    return NULL;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        ".p2align 4\n"
        "dlsym:\n"
        "    .cfi_startproc\n"
        "    endbr64\n"
        "    pushq %rdi\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    pushq %rsi\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    subq $24, %rsp\n" /* keeps the stack 16-byte aligned at the call */
        "    .cfi_adjust_cfa_offset 24\n"
        "    movq $0, (%rsp)\n"
        "    movq %rsp, %rdx\n"
        "    call gs_dlsym_pre\n"
        "    movq (%rsp), %r11\n"
        "    addq $24, %rsp\n"
        "    .cfi_adjust_cfa_offset -24\n"
        "    popq %rsi\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    popq %rdi\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    testq %rax, %rax\n"
        "    jnz 1f\n"
        "    jmp *%r11\n"
        "1:  ret\n"
        "    .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
GS_EXPORT void *dlsym(void *handle, const char *name) {
    const char *symbol = name;
    __asm__("" : "+r"(symbol)); /* dlfcn.h declares name nonnull; callers can still pass NULL */
    gs_dlsym_fn real = null_dlsym;
    void *hook = gs_dlsym_pre(handle, symbol, &real);
    return hook != NULL ? hook : real(handle, symbol);
}
#endif
