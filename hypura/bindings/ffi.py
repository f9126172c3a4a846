"""cffi declarations of our C hook API (include/hypura.h in patches/) and the few ggml calls
Hypura makes itself, 1:1 with the C headers. Policy lives elsewhere (hypura.runtime).

ABI mode: `ffi.dlopen` of the same libllama llama-cpp-python loaded; ggml symbols resolve
through libllama's dependencies (libggml, libggml-base).
"""

import functools

import cffi

from hypura.bindings.library import point_llama_cpp_at_our_library
from hypura.errors import HypuraError

ffi = cffi.FFI()

# include/hypura.h
ffi.cdef(
    """
    enum hypura_tier {
        HYPURA_TIER_DEFAULT = 0,
        HYPURA_TIER_GPU     = 1,
        HYPURA_TIER_HOST    = 2,
        HYPURA_TIER_PINNED  = 3,
    };
    enum hypura_place_flags {
        HYPURA_PLACE_DEFER = 1,
        HYPURA_PLACE_POOL  = 2,
    };
    struct hypura_tensor_info {
        const char * name;
        int32_t      type;
        int32_t      n_dims;
        int64_t      ne[4];
        uint64_t     file_offset;
        uint64_t     nbytes;
        uint32_t     file_idx;
        int32_t      layer;
        int32_t      default_tier;
        const char * default_buft;
    };
    struct hypura_placement {
        int32_t  tier;
        uint32_t flags;
        int32_t  pool_slot;
    };
    struct ggml_tensor;
    struct llama_model;
    typedef int32_t (*hypura_place_fn)(const struct hypura_tensor_info * info, struct hypura_placement * out, void * user_data);
    typedef int32_t (*hypura_fill_fn) (const struct hypura_tensor_info * info, struct ggml_tensor * tensor, void * user_data);
    struct hypura_loader_hooks {
        hypura_place_fn place;
        hypura_fill_fn  fill;
        void *          user_data;
    };
    int32_t hypura_api_version(void);
    void hypura_loader_hooks_set(const struct hypura_loader_hooks * hooks);
    void hypura_cpu_compute_pageable(bool pageable);
    const char * hypura_model_tensor_buft(const struct llama_model * model, const char * name);

    typedef int32_t (*hypura_unit_fn)(int32_t unit, void * user_data);
    typedef int32_t (*hypura_route_fn)(int32_t layer, struct ggml_tensor * selected, void * user_data);
    struct hypura_stream_hooks {
        hypura_unit_fn  before;
        hypura_unit_fn  after;
        hypura_route_fn routed;
        void *          user_data;
    };
    struct hypura_stream;
    struct hypura_stream * hypura_stream_new(const struct hypura_stream_hooks * hooks);
    void hypura_stream_free(struct hypura_stream * stream);
    int32_t hypura_stream_add(struct hypura_stream * stream, const struct ggml_tensor * weight, int32_t unit);
    bool hypura_stream_failed(const struct hypura_stream * stream);
    int32_t hypura_stream_add_router(struct hypura_stream * stream, int32_t layer);
    struct hypura_split_mark {
        int64_t      t_us;
        const char * backend;
        const char * node;
    };
    void hypura_stream_profile(struct hypura_stream * stream, bool on);
    int32_t hypura_stream_profile_read(struct hypura_stream * stream, struct hypura_split_mark * out, int32_t n);
    bool hypura_stream_eval(struct ggml_tensor * t, bool ask, void * stream);

    struct hypura_expert_cache {
        struct ggml_tensor * experts[3];
        struct ggml_tensor * slots[3];
        struct ggml_tensor * ids;
        int32_t n_slots;
        int32_t max_tokens;
        int32_t n_expert;
        int32_t * slot_of;
    };
    const struct hypura_expert_cache * hypura_expert_cache_new(
        const struct llama_model * model, int32_t layer, int32_t n_slots, int32_t max_tokens, int32_t tier);
    void hypura_expert_caches_free(const struct llama_model * model);
    int32_t hypura_stream_add_expert_cache(struct hypura_stream * stream, int32_t layer,
                                           const struct hypura_expert_cache * cache);
    int32_t hypura_stream_log_read(struct hypura_stream * stream, int32_t * out, int32_t n);
    """
)

# ggml.h / ggml-backend.h: writing tensors, probing devices, copies on a stream of our own
ffi.cdef(
    """
    typedef struct ggml_backend_device * ggml_backend_dev_t;
    typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;
    typedef struct ggml_backend_buffer * ggml_backend_buffer_t;
    typedef struct ggml_backend * ggml_backend_t;
    typedef struct ggml_backend_event * ggml_backend_event_t;
    enum ggml_backend_dev_type {
        GGML_BACKEND_DEVICE_TYPE_CPU,
        GGML_BACKEND_DEVICE_TYPE_GPU,
        GGML_BACKEND_DEVICE_TYPE_IGPU,
        GGML_BACKEND_DEVICE_TYPE_ACCEL,
        GGML_BACKEND_DEVICE_TYPE_META,
    };
    struct ggml_init_params {
        size_t mem_size;
        void * mem_buffer;
        bool   no_alloc;
    };
    struct ggml_context;

    size_t ggml_nbytes(const struct ggml_tensor * tensor);
    void * ggml_get_data(const struct ggml_tensor * tensor);
    int64_t ggml_time_us(void);
    const char * ggml_get_name(const struct ggml_tensor * tensor);
    struct ggml_context * ggml_init(struct ggml_init_params params);
    void ggml_free(struct ggml_context * ctx);
    size_t ggml_tensor_overhead(void);
    struct ggml_tensor * ggml_new_tensor_1d(struct ggml_context * ctx, int type, int64_t ne0);
    int64_t ggml_blck_size(int type);
    size_t ggml_type_size(int type);
    const char * ggml_type_name(int type);

    size_t ggml_backend_dev_count(void);
    ggml_backend_dev_t ggml_backend_dev_get(size_t index);
    const char * ggml_backend_dev_name(ggml_backend_dev_t device);
    const char * ggml_backend_dev_description(ggml_backend_dev_t device);
    void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
    enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
    ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
    ggml_backend_buffer_type_t ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device);
    ggml_backend_t ggml_backend_dev_init(ggml_backend_dev_t device, const char * params);

    const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
    ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size);
    ggml_backend_buffer_t ggml_backend_dev_buffer_from_host_ptr(ggml_backend_dev_t device, void * ptr, size_t size,
                                                                size_t max_tensor_size);
    void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer);
    size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer);
    bool ggml_backend_buffer_is_host(ggml_backend_buffer_t buffer);
    void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
    ggml_backend_buffer_t ggml_backend_alloc_ctx_tensors_from_buft(struct ggml_context * ctx, ggml_backend_buffer_type_t buft);

    void ggml_backend_tensor_set(struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);
    void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
    void ggml_backend_tensor_copy(struct ggml_tensor * src, struct ggml_tensor * dst);
    void ggml_backend_tensor_set_async(ggml_backend_t backend, struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);
    void ggml_backend_synchronize(ggml_backend_t backend);
    void ggml_backend_free(ggml_backend_t backend);

    ggml_backend_event_t ggml_backend_event_new(ggml_backend_dev_t device);
    void ggml_backend_event_free(ggml_backend_event_t event);
    void ggml_backend_event_record(ggml_backend_event_t event, ggml_backend_t backend);
    void ggml_backend_event_synchronize(ggml_backend_event_t event);

    int32_t hypura_stream_set_home(struct hypura_stream * stream, const struct ggml_tensor * weight,
                                   ggml_backend_buffer_t buffer, void * data);
    int32_t hypura_stream_place(struct hypura_stream * stream, const struct ggml_tensor * weight, int32_t slot);
    """
)

# ggml-backend.h's registry: RPC servers become devices through the RPC reg's own proc address, as common/arg.cpp
# registers them (ggml-rpc.h: ggml_backend_rpc_add_server); a build without the RPC backend has no "RPC" reg
ffi.cdef(
    """
    typedef struct ggml_backend_reg * ggml_backend_reg_t;
    typedef ggml_backend_reg_t (*ggml_backend_rpc_add_server_t)(const char * endpoint);
    ggml_backend_reg_t ggml_backend_reg_by_name(const char * name);
    const char * ggml_backend_reg_name(ggml_backend_reg_t reg);
    size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
    ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
    void * ggml_backend_reg_get_proc_address(ggml_backend_reg_t reg, const char * name);
    void ggml_backend_register(ggml_backend_reg_t reg);
    ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
    ggml_backend_dev_t ggml_backend_dev_by_name(const char * name);
    """
)

# ggml.h / ggml-backend.h: a matrix-vector product computed on a device (what decode does), to time a remote one
ffi.cdef(
    """
    struct ggml_cgraph;
    struct ggml_tensor * ggml_new_tensor_2d(struct ggml_context * ctx, int type, int64_t ne0, int64_t ne1);
    struct ggml_tensor * ggml_mul_mat(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
    struct ggml_cgraph * ggml_new_graph(struct ggml_context * ctx);
    void ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);
    size_t ggml_graph_overhead(void);
    int ggml_backend_graph_compute(ggml_backend_t backend, struct ggml_cgraph * cgraph);
    """
)

EXPECTED_API_VERSION = 11


@functools.lru_cache(maxsize=None)
def lib():
    """Our patched libllama, opened once; checks it really carries the hook API."""
    path = point_llama_cpp_at_our_library()
    handle = ffi.dlopen(str(path))
    try:
        version = handle.hypura_api_version()
    except AttributeError:
        raise HypuraError(
            f"{path} is a vanilla llama.cpp without Hypura's hooks: run ./build.sh"
        ) from None
    if version != EXPECTED_API_VERSION:
        raise HypuraError(
            f"{path} has hook API v{version}, this hypura needs v{EXPECTED_API_VERSION}: run ./build.sh"
        )
    return handle
