/*
 * Mock CUDA driver: streams, kernel launches, graphs and synchronisation.
 *
 * Each device is one timeline shared by every process (busy_until in the state file): a launch
 * returns at once and queues its kernel after whatever is already queued; synchronising sleeps
 * until the caller's last kernel has ended. A kernel lasts the device's kernel_time_us, or, when
 * `extra` is NULL and params[0] points to an unsigned int, that many microseconds.
 */
#include "cuda_internal.h"

#include <stdlib.h>

CUresult mock_stream_resolve_locked(CUstream stream, struct mock_context **context,
                                    struct mock_stream **resolved)
{
    *resolved = NULL;
    if (stream == NULL || stream == MOCK_STREAM_LEGACY || stream == MOCK_STREAM_PER_THREAD) {
        *context = mock_current_context_locked();
        return *context ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!mock_handle_live(stream, MOCK_HANDLE_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    struct mock_stream *created = (struct mock_stream *)stream;
    if (!mock_handle_live(created->context, MOCK_HANDLE_CONTEXT) || !created->context->active)
        return CUDA_ERROR_INVALID_CONTEXT;
    *context = created->context;
    *resolved = created;
    return CUDA_SUCCESS;
}

static void raise_to(_Atomic uint64_t *value, uint64_t candidate)
{
    uint64_t seen = atomic_load(value);
    while (seen < candidate && !atomic_compare_exchange_weak(value, &seen, candidate)) {
    }
}

/* Queues `kernels` kernels of duration_ns each on the stream's device. */
static CUresult enqueue(CUstream stream, uint64_t duration_ns, uint64_t kernels)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    rc = mock_stream_resolve_locked(stream, &context, &resolved);
    if (rc == CUDA_SUCCESS && kernels > 0) {
        uint64_t total = 0;
        if (__builtin_mul_overflow(duration_ns, kernels, &total)) {
            rc = CUDA_ERROR_INVALID_VALUE;
        } else if (mock_shared_lock() != 0) {
            rc = CUDA_ERROR_UNKNOWN;
        } else {
            uint64_t end = mock_timeline_submit_locked(context->device, total);
            mock_shared_unlock();
            raise_to(&context->last_end_ns, end);
            if (resolved)
                raise_to(&resolved->last_end_ns, end);
        }
    }
    mock_cuda_unlock();
    return rc;
}

static CUresult launch(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                       unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                       unsigned int block_z, CUstream stream, void **params, void **extra)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!function)
        return CUDA_ERROR_INVALID_HANDLE;
    if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 ||
        block_z == 0 || (uint64_t)block_x * block_y * block_z > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult ctx_rc = CUDA_SUCCESS;
    int device = 0;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    ctx_rc = mock_stream_resolve_locked(stream, &context, &resolved);
    if (ctx_rc == CUDA_SUCCESS)
        device = context->device;
    mock_cuda_unlock();
    if (ctx_rc != CUDA_SUCCESS)
        return ctx_rc;
    uint64_t duration = mock_cfg()->devices[device].kernel_time_ns;
    if (!extra && params && params[0])
        duration = (uint64_t)*(const unsigned int *)params[0] * 1000u;
    return enqueue(stream, duration, 1);
}

MOCK_EXPORT CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y,
                                    unsigned int grid_z, unsigned int block_x,
                                    unsigned int block_y, unsigned int block_z,
                                    unsigned int shared_bytes, CUstream stream, void **params,
                                    void **extra)
{
    (void)shared_bytes;
    return launch(function, grid_x, grid_y, grid_z, block_x, block_y, block_z, stream, params,
                  extra);
}

MOCK_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction function, unsigned int grid_x,
                                         unsigned int grid_y, unsigned int grid_z,
                                         unsigned int block_x, unsigned int block_y,
                                         unsigned int block_z, unsigned int shared_bytes,
                                         CUstream stream, void **params, void **extra)
{
    (void)shared_bytes;
    return launch(function, grid_x, grid_y, grid_z, block_x, block_y, block_z, stream, params,
                  extra);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction function, void **params,
                          void **extra)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!config || (config->numAttrs > 0 && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    return launch(function, config->gridDimX, config->gridDimY, config->gridDimZ,
                  config->blockDimX, config->blockDimY, config->blockDimZ, config->hStream,
                  params, extra);
}

MOCK_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction function,
                                      void **params, void **extra)
{
    return launch_ex(config, function, params, extra);
}

MOCK_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction function,
                                           void **params, void **extra)
{
    return launch_ex(config, function, params, extra);
}

MOCK_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction function, unsigned int grid_x,
                                               unsigned int grid_y, unsigned int grid_z,
                                               unsigned int block_x, unsigned int block_y,
                                               unsigned int block_z, unsigned int shared_bytes,
                                               CUstream stream, void **params)
{
    (void)shared_bytes;
    return launch(function, grid_x, grid_y, grid_z, block_x, block_y, block_z, stream, params,
                  NULL);
}

MOCK_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction function, unsigned int grid_x,
                                                    unsigned int grid_y, unsigned int grid_z,
                                                    unsigned int block_x, unsigned int block_y,
                                                    unsigned int block_z,
                                                    unsigned int shared_bytes, CUstream stream,
                                                    void **params)
{
    (void)shared_bytes;
    return launch(function, grid_x, grid_y, grid_z, block_x, block_y, block_z, stream, params,
                  NULL);
}

/* ---- graphs -------------------------------------------------------------------------------- */

static CUresult graph_new(void **out, unsigned int kernels, enum mock_handle_type type)
{
    struct mock_graph *graph = malloc(sizeof *graph);
    if (!graph)
        return CUDA_ERROR_OUT_OF_MEMORY;
    graph->kernels = kernels;
    CUresult rc = mock_handle_add(graph, type);
    if (rc != CUDA_SUCCESS)
        free(graph);
    else
        *out = graph;
    return rc;
}

static CUresult graph_delete(void *graph, enum mock_handle_type type)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    if (mock_handle_live(graph, type)) {
        mock_handle_remove(graph);
        free(graph);
    } else {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!graph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    void *created = NULL;
    rc = graph_new(&created, 1, MOCK_HANDLE_GRAPH);
    if (rc == CUDA_SUCCESS)
        *graph = (CUgraph)created;
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult gpushareMockGraphSetKernelCount(CUgraph graph, unsigned int kernels)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    if (mock_handle_live(graph, MOCK_HANDLE_GRAPH))
        ((struct mock_graph *)graph)->kernels = kernels;
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    return graph_delete(graph, MOCK_HANDLE_GRAPH);
}

MOCK_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                 unsigned long long flags)
{
    (void)flags;
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    if (!mock_current_context_locked()) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (!mock_handle_live(graph, MOCK_HANDLE_GRAPH)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        void *created = NULL;
        rc = graph_new(&created, ((struct mock_graph *)graph)->kernels, MOCK_HANDLE_GRAPH_EXEC);
        if (rc == CUDA_SUCCESS)
            *exec = (CUgraphExec)created;
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    return graph_delete(exec, MOCK_HANDLE_GRAPH_EXEC);
}

static CUresult graph_launch(CUgraphExec exec, CUstream stream)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    unsigned int kernels = 0;
    int device = 0;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    if (!mock_handle_live(exec, MOCK_HANDLE_GRAPH_EXEC)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        kernels = ((struct mock_graph *)exec)->kernels;
        rc = mock_stream_resolve_locked(stream, &context, &resolved);
        if (rc == CUDA_SUCCESS)
            device = context->device;
    }
    mock_cuda_unlock();
    if (rc != CUDA_SUCCESS)
        return rc;
    return enqueue(stream, mock_cfg()->devices[device].kernel_time_ns, kernels);
}

MOCK_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream);
}

MOCK_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    return graph_launch(exec, stream);
}

/* ---- streams ------------------------------------------------------------------------------- */

MOCK_EXPORT CUresult cuStreamCreate(CUstream *out, unsigned int flags)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!out || flags > 1) /* CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING */
        return CUDA_ERROR_INVALID_VALUE;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = mock_current_context_locked();
    struct mock_stream *stream = context ? calloc(1, sizeof *stream) : NULL;
    if (!context) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (!stream) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        stream->context = context;
        rc = mock_handle_add(stream, MOCK_HANDLE_STREAM);
        if (rc == CUDA_SUCCESS)
            *out = (CUstream)stream;
        else
            free(stream);
    }
    mock_cuda_unlock();
    return rc;
}

MOCK_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    if (mock_handle_live(stream, MOCK_HANDLE_STREAM)) {
        mock_handle_remove(stream);
        free(stream);
    } else {
        rc = CUDA_ERROR_INVALID_HANDLE;
    }
    mock_cuda_unlock();
    return rc;
}

static CUresult stream_synchronize(CUstream stream)
{
    CUresult rc = mock_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (mock_cuda_lock() != 0)
        return CUDA_ERROR_UNKNOWN;
    struct mock_context *context = NULL;
    struct mock_stream *resolved = NULL;
    uint64_t deadline = 0;
    rc = mock_stream_resolve_locked(stream, &context, &resolved);
    if (rc == CUDA_SUCCESS)
        deadline = atomic_load(resolved ? &resolved->last_end_ns : &context->last_end_ns);
    mock_cuda_unlock();
    if (rc == CUDA_SUCCESS)
        mock_sleep_until_ns(deadline);
    return rc;
}

MOCK_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    return stream_synchronize(stream);
}

MOCK_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream)
{
    return stream_synchronize(stream);
}
