/*
 * mca_btl_udbtl: the Open MPI side of the component.
 *
 * Open MPI finds a component by its exported struct and drives it through
 * function pointers in structs whose layouts only its headers know. This file
 * is therefore the one place that includes them: it fills the component and
 * module structs, keeps Open MPI's descriptors, and forwards every call to
 * the small `udbtl_rs_*` surface in Rust (src/ffi.rs), which owns the
 * transport. Rust calls back in through the three `udbtl_c_*` functions at
 * the end, from progress, with its module unlocked, so that ob1's callbacks
 * may call this BTL again (ob1 sends from inside its receive and completion
 * callbacks).
 *
 * Threads: the component serves MPI_THREAD_SINGLE, FUNNELED and SERIALIZED
 * (one thread in MPI at a time). Like Open MPI's components without thread
 * support, it declines to load when MPI threads are enabled
 * (MPI_THREAD_MULTIPLE), so Open MPI picks another BTL or says no BTL
 * reaches the peer.
 */

#include "opal_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/class/opal_object.h"
#include "opal/datatype/opal_convertor.h"
#include "opal/mca/base/mca_base_var.h"
#include "opal/mca/btl/btl.h"
#include "opal/mca/btl/base/base.h"
#include "opal/mca/pmix/pmix.h"
#include "opal/util/output.h"
#include "opal/util/proc.h"

/* ----- the Rust surface (src/ffi.rs) ------------------------------------ */

/* Statuses the Rust side returns. */
#define UDBTL_RS_OK 0
#define UDBTL_RS_BUSY (-1)
#define UDBTL_RS_UNREACH (-2)
#define UDBTL_RS_ERROR (-3)

/* What Open MPI learns of a module. */
struct udbtl_rs_limits {
    size_t eager_limit;
    size_t rndv_eager_limit;
    size_t max_send_size;
    uint32_t exclusivity;
    uint32_t bandwidth;
};

extern size_t udbtl_rs_param_count(void);
extern int udbtl_rs_param(size_t index, const char **name, const char **default_value,
                          const char **help, int *from_seed);
extern void *udbtl_rs_init(const char *const *values, uint32_t job_id, uint32_t rank,
                           size_t *modules, char *error, size_t error_len);
extern void *udbtl_rs_module(void *component, size_t index, struct udbtl_rs_limits *limits);
extern size_t udbtl_rs_modex(void *component, uint8_t *blob, size_t capacity);
extern int udbtl_rs_add_proc(void *module, const uint8_t *blob, size_t len, uint64_t context,
                             uint32_t *endpoint);
extern int udbtl_rs_del_proc(void *module, uint32_t endpoint);
extern int udbtl_rs_progress(void *module, void *btl);
extern int udbtl_rs_alloc(void *module, uint8_t order, size_t size, uint32_t *des, void **data);
extern int udbtl_rs_prepare_lent(void *module, uint8_t order, size_t reserve, const void *data,
                                 size_t len, uint32_t *des, void **header);
extern int udbtl_rs_free(void *module, uint32_t des);
extern int udbtl_rs_send(void *module, uint32_t endpoint, uint32_t des, size_t len, uint8_t tag,
                         int owned, uint64_t context);
extern size_t udbtl_rs_dump(void *module, char *text, size_t capacity);
extern size_t udbtl_rs_stats_line(void *module, char *text, size_t capacity);
extern int udbtl_rs_finalize(void *component, char *error, size_t error_len);

/* ----- types ------------------------------------------------------------ */

typedef struct udbtl_module {
    mca_btl_base_module_t super;
    void *rs;
    mca_btl_base_module_error_cb_fn_t error_cb;
    /* Frags not in use, and every frag ever made (to free them at finalize). */
    struct udbtl_frag *free_frags;
    struct udbtl_frag *all_frags;
} udbtl_module_t;

/* Opaque to ob1, which only hands it back. */
struct mca_btl_base_endpoint_t {
    opal_proc_t *proc;
    udbtl_module_t *module;
    uint32_t id;
    /* The peer's loss was reported to ob1 (once is enough: it aborts). */
    bool lost;
};

/* Contiguous data at least this long is sent from the user's buffer, not
 * copied: below it, copying costs less than the registration lookup. */
#define UDBTL_ZERO_COPY_MIN 16384

/* An Open MPI descriptor around a Rust send fragment: one segment, or, when
 * it sends from the user's buffer, the header and then the data. */
typedef struct udbtl_frag {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segments[2];
    udbtl_module_t *module;
    struct mca_btl_base_endpoint_t *endpoint;
    uint32_t des;
    /* send returned 1: ob1 has already counted it complete, so the
     * completion only frees it. */
    int silent;
    struct udbtl_frag *next_free;
    struct udbtl_frag *next_all;
} udbtl_frag_t;

typedef struct udbtl_component {
    mca_btl_base_component_3_0_0_t super;
    void *rs;
    size_t num_modules;
    udbtl_module_t **modules;
    size_t num_params;
    bool print_stats;
    unsigned latency;
} udbtl_component_t;

OPAL_MODULE_DECLSPEC extern udbtl_component_t mca_btl_udbtl_component;


/* One string per Rust parameter, and its MCA variable index. The variable
 * system keeps pointers to the strings until the component is unloaded, after
 * close, so they are static. */
#define UDBTL_MAX_PARAMS 64
static char *param_values[UDBTL_MAX_PARAMS];
static int param_index[UDBTL_MAX_PARAMS];

/* ----- parameters ------------------------------------------------------- */

static int udbtl_register(void)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    c->num_params = udbtl_rs_param_count();
    if (c->num_params > UDBTL_MAX_PARAMS) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    for (size_t i = 0; i < c->num_params; ++i) {
        const char *name, *def, *help;
        int from_seed;
        if (0 != udbtl_rs_param(i, &name, &def, &help, &from_seed)) {
            return OPAL_ERROR;
        }
        /* Values are registered as strings and parsed by the Rust side,
         * which knows each one's syntax and range (shown in the help). */
        param_values[i] = NULL == def ? NULL : strdup(def);
        param_index[i] = mca_base_component_var_register(
            &c->super.btl_version, name, help, MCA_BASE_VAR_TYPE_STRING, NULL, 0,
            NULL == def ? MCA_BASE_VAR_FLAG_DEF_UNSET : 0,
            from_seed ? OPAL_INFO_LVL_4 : OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_READONLY,
            &param_values[i]);
    }
    c->print_stats = false;
    (void) mca_base_component_var_register(
        &c->super.btl_version, "print_stats",
        "Print each module's counters (udbtl-stats: ...) on stderr at finalize",
        MCA_BASE_VAR_TYPE_BOOL, NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_LOCAL,
        &c->print_stats);
    c->latency = 100;
    (void) mca_base_component_var_register(
        &c->super.btl_version, "latency",
        "Relative latency that ob1 ranks BTLs by (lower is preferred)",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_5,
        MCA_BASE_VAR_SCOPE_READONLY, &c->latency);
    return OPAL_SUCCESS;
}

static int udbtl_open(void)
{
    return OPAL_SUCCESS;
}

static int udbtl_close(void)
{
    return OPAL_SUCCESS;
}

/* ----- module functions ------------------------------------------------- */

static udbtl_frag_t *frag_get(udbtl_module_t *m)
{
    udbtl_frag_t *frag = m->free_frags;
    if (NULL != frag) {
        m->free_frags = frag->next_free;
    } else {
        frag = calloc(1, sizeof(*frag));
        if (NULL == frag) {
            return NULL;
        }
        OBJ_CONSTRUCT(&frag->base, mca_btl_base_descriptor_t);
        frag->module = m;
        frag->next_all = m->all_frags;
        m->all_frags = frag;
    }
    frag->base.des_segments = frag->segments;
    frag->base.des_segment_count = 1;
    frag->base.des_cbfunc = NULL;
    frag->base.des_cbdata = NULL;
    frag->base.des_context = NULL;
    frag->base.order = MCA_BTL_NO_ORDER;
    frag->endpoint = NULL;
    frag->silent = 0;
    return frag;
}

static void frag_put(udbtl_frag_t *frag)
{
    udbtl_module_t *m = frag->module;
    frag->next_free = m->free_frags;
    m->free_frags = frag;
}

/* A frag with room for `size` bytes from Rust's send free list. */
static udbtl_frag_t *frag_alloc(udbtl_module_t *m, uint8_t order, size_t size, uint32_t flags)
{
    uint32_t des;
    void *data;
    if (UDBTL_RS_OK != udbtl_rs_alloc(m->rs, order, size, &des, &data)) {
        return NULL;
    }
    udbtl_frag_t *frag = frag_get(m);
    if (NULL == frag) {
        (void) udbtl_rs_free(m->rs, des);
        return NULL;
    }
    frag->des = des;
    frag->segments[0].seg_addr.pval = data;
    frag->segments[0].seg_len = size;
    frag->base.des_flags = flags;
    frag->base.order = order;
    return frag;
}

static int udbtl_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                           struct opal_proc_t **procs,
                           struct mca_btl_base_endpoint_t **peers,
                           opal_bitmap_t *reachable)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    const opal_proc_t *self = opal_proc_local_get();
    for (size_t i = 0; i < nprocs; ++i) {
        opal_proc_t *proc = procs[i];
        /* The self BTL serves this process. */
        if (proc == self || 0 == opal_compare_proc(proc->proc_name, self->proc_name)) {
            continue;
        }
        uint8_t *blob = NULL;
        size_t size = 0;
        int rc;
        OPAL_MODEX_RECV(rc, &mca_btl_udbtl_component.super.btl_version, &proc->proc_name,
                        (void **) &blob, &size);
        if (OPAL_SUCCESS != rc || NULL == blob) {
            /* It published no address: unreachable through udbtl, which is
             * not an error (another BTL may reach it). */
            continue;
        }
        struct mca_btl_base_endpoint_t *ep = calloc(1, sizeof(*ep));
        if (NULL == ep) {
            free(blob);
            return OPAL_ERR_OUT_OF_RESOURCE;
        }
        ep->proc = proc;
        ep->module = m;
        rc = udbtl_rs_add_proc(m->rs, blob, size, (uint64_t) (uintptr_t) ep, &ep->id);
        free(blob);
        if (UDBTL_RS_OK != rc) {
            free(ep);
            if (UDBTL_RS_UNREACH == rc) {
                continue;
            }
            return OPAL_ERROR;
        }
        peers[i] = ep;
        if (NULL != reachable) {
            opal_bitmap_set_bit(reachable, (int) i);
        }
    }
    return OPAL_SUCCESS;
}

static int udbtl_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs,
                           struct opal_proc_t **procs, struct mca_btl_base_endpoint_t **peers)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    (void) procs;
    for (size_t i = 0; i < nprocs; ++i) {
        if (NULL == peers[i]) {
            continue;
        }
        (void) udbtl_rs_del_proc(m->rs, peers[i]->id);
        free(peers[i]);
        peers[i] = NULL;
    }
    return OPAL_SUCCESS;
}

static int udbtl_register_tag(struct mca_btl_base_module_t *btl, mca_btl_base_tag_t tag,
                              mca_btl_base_module_recv_cb_fn_t cbfunc, void *cbdata)
{
    /* Receive callbacks are looked up in Open MPI's table of active message
     * triggers, which the BML fills for every BTL; nothing to keep here. */
    (void) btl;
    (void) tag;
    (void) cbfunc;
    (void) cbdata;
    return OPAL_SUCCESS;
}

static int udbtl_register_error(struct mca_btl_base_module_t *btl,
                                mca_btl_base_module_error_cb_fn_t cbfunc)
{
    ((udbtl_module_t *) btl)->error_cb = cbfunc;
    return OPAL_SUCCESS;
}

static mca_btl_base_descriptor_t *udbtl_alloc(struct mca_btl_base_module_t *btl,
                                              struct mca_btl_base_endpoint_t *endpoint,
                                              uint8_t order, size_t size, uint32_t flags)
{
    udbtl_frag_t *frag = frag_alloc((udbtl_module_t *) btl, order, size, flags);
    if (NULL == frag) {
        return NULL;
    }
    frag->endpoint = endpoint;
    return &frag->base;
}

static int udbtl_free(struct mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des)
{
    udbtl_frag_t *frag = (udbtl_frag_t *) des;
    int rc = udbtl_rs_free(((udbtl_module_t *) btl)->rs, frag->des);
    if (UDBTL_RS_OK != rc) {
        return OPAL_ERROR;
    }
    frag_put(frag);
    return OPAL_SUCCESS;
}

/* Sends contiguous data from the user's buffer: the header goes in a
 * registered fragment, the data is read in place when posted and whenever
 * retransmitted; ob1 keeps the buffer until the send callback. NULL when
 * Rust cannot (the caller copies instead). */
static udbtl_frag_t *prepare_zero_copy(udbtl_module_t *m, struct opal_convertor_t *convertor,
                                       uint8_t order, size_t reserve, size_t want,
                                       uint32_t flags)
{
    size_t position = convertor->bConverted;
    /* A contiguous convertor packs by pointing into the user's memory. */
    struct iovec iov = {.iov_base = NULL, .iov_len = want};
    uint32_t iov_count = 1;
    size_t taken = want;
    if (opal_convertor_pack(convertor, &iov, &iov_count, &taken) < 0 || 0 == taken) {
        opal_convertor_set_position(convertor, &position);
        return NULL;
    }
    uint32_t des;
    void *header;
    udbtl_frag_t *frag = NULL;
    if (UDBTL_RS_OK
        == udbtl_rs_prepare_lent(m->rs, order, reserve, iov.iov_base, taken, &des, &header)) {
        frag = frag_get(m);
        if (NULL == frag) {
            (void) udbtl_rs_free(m->rs, des);
        }
    }
    if (NULL == frag) {
        opal_convertor_set_position(convertor, &position);
        return NULL;
    }
    frag->des = des;
    frag->segments[0].seg_addr.pval = header;
    frag->segments[0].seg_len = reserve;
    frag->segments[1].seg_addr.pval = iov.iov_base;
    frag->segments[1].seg_len = taken;
    frag->base.des_segment_count = 2;
    frag->base.des_flags = flags;
    frag->base.order = order;
    return frag;
}

/* Packs up to `*size` bytes from the convertor after `reserve` bytes of the
 * caller's header. Large contiguous data is sent from the user's buffer;
 * the rest is copied into a fragment kept until the peer acknowledges it,
 * so the user's buffer is free at once. */
static mca_btl_base_descriptor_t *udbtl_prepare_src(struct mca_btl_base_module_t *btl,
                                                    struct mca_btl_base_endpoint_t *endpoint,
                                                    struct opal_convertor_t *convertor,
                                                    uint8_t order, size_t reserve, size_t *size,
                                                    uint32_t flags)
{
    size_t max = btl->btl_max_send_size;
    if (reserve > max) {
        return NULL;
    }
    size_t want = *size;
    if (want > max - reserve) {
        want = max - reserve;
    }
    if (want >= UDBTL_ZERO_COPY_MIN && 0 == opal_convertor_need_buffers(convertor)) {
        udbtl_frag_t *frag = prepare_zero_copy((udbtl_module_t *) btl, convertor, order, reserve,
                                               want, flags);
        if (NULL != frag) {
            *size = frag->segments[1].seg_len;
            frag->endpoint = endpoint;
            return &frag->base;
        }
    }
    udbtl_frag_t *frag = frag_alloc((udbtl_module_t *) btl, order, reserve + want, flags);
    if (NULL == frag) {
        return NULL;
    }
    size_t packed = 0;
    if (want > 0) {
        struct iovec iov = {.iov_base = (char *) frag->segments[0].seg_addr.pval + reserve,
                            .iov_len = want};
        uint32_t iov_count = 1;
        packed = want;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &packed) < 0) {
            (void) udbtl_free(btl, &frag->base);
            return NULL;
        }
    }
    *size = packed;
    frag->segments[0].seg_len = reserve + packed;
    frag->endpoint = endpoint;
    return &frag->base;
}

static int udbtl_send(struct mca_btl_base_module_t *btl,
                      struct mca_btl_base_endpoint_t *endpoint,
                      struct mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    udbtl_frag_t *frag = (udbtl_frag_t *) des;
    int owned = 0 != (des->des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP);
    /* The bytes are in our fragment, which is kept until acknowledged: for
     * ob1, a send it lets us own is complete now. It returns 1, after the
     * callback if ob1 asked for one, as a BTL that sent inline does; the
     * acknowledgement only frees the fragment. Data sent from the user's
     * buffer completes at its acknowledgement. */
    frag->silent = owned && 1 == des->des_segment_count;
    frag->endpoint = endpoint;
    int rc = udbtl_rs_send(m->rs, endpoint->id, frag->des, frag->segments[0].seg_len, tag, owned,
                           (uint64_t) (uintptr_t) frag);
    if (UDBTL_RS_OK != rc) {
        frag->silent = 0;
        return UDBTL_RS_UNREACH == rc ? OPAL_ERR_UNREACH : OPAL_ERROR;
    }
    if (!frag->silent) {
        return OPAL_SUCCESS;
    }
    if (0 != (des->des_flags & MCA_BTL_DES_SEND_ALWAYS_CALLBACK) && NULL != des->des_cbfunc) {
        des->des_cbfunc(btl, endpoint, des, OPAL_SUCCESS);
    }
    return 1;
}

/* The inline fast path: header and data packed into one fragment and sent,
 * complete for the caller on return. */
static int udbtl_sendi(struct mca_btl_base_module_t *btl,
                       struct mca_btl_base_endpoint_t *endpoint,
                       struct opal_convertor_t *convertor, void *header, size_t header_size,
                       size_t payload_size, uint8_t order, uint32_t flags,
                       mca_btl_base_tag_t tag, mca_btl_base_descriptor_t **descriptor)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    size_t total = header_size + payload_size;
    if (total > btl->btl_eager_limit) {
        if (NULL != descriptor) {
            *descriptor = NULL;
        }
        return OPAL_ERR_RESOURCE_BUSY;
    }
    udbtl_frag_t *frag = frag_alloc(m, order, total, flags | MCA_BTL_DES_FLAGS_BTL_OWNERSHIP);
    if (NULL == frag) {
        if (NULL != descriptor) {
            *descriptor = NULL;
        }
        return OPAL_ERR_RESOURCE_BUSY;
    }
    memcpy(frag->segments[0].seg_addr.pval, header, header_size);
    if (payload_size > 0) {
        struct iovec iov = {.iov_base = (char *) frag->segments[0].seg_addr.pval + header_size,
                            .iov_len = payload_size};
        uint32_t iov_count = 1;
        size_t packed = payload_size;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &packed) < 0
            || packed != payload_size) {
            (void) udbtl_free(btl, &frag->base);
            return OPAL_ERROR;
        }
    }
    frag->silent = 1;
    frag->endpoint = endpoint;
    int rc = udbtl_rs_send(m->rs, endpoint->id, frag->des, total, tag, 1,
                           (uint64_t) (uintptr_t) frag);
    if (UDBTL_RS_OK != rc) {
        (void) udbtl_free(btl, &frag->base);
        return UDBTL_RS_UNREACH == rc ? OPAL_ERR_UNREACH : OPAL_ERROR;
    }
    if (NULL != descriptor) {
        *descriptor = NULL;
    }
    return OPAL_SUCCESS;
}

static void udbtl_dump(struct mca_btl_base_module_t *btl,
                       struct mca_btl_base_endpoint_t *endpoint, int verbose)
{
    char text[4096];
    (void) endpoint;
    (void) verbose;
    (void) udbtl_rs_dump(((udbtl_module_t *) btl)->rs, text, sizeof(text));
    opal_output(0, "%s", text);
}

static int udbtl_ft_event(int state)
{
    /* No checkpoint/restart support: every state is accepted. */
    (void) state;
    return OPAL_SUCCESS;
}

static int udbtl_finalize(struct mca_btl_base_module_t *btl);

static const mca_btl_base_module_t udbtl_module_template = {
    .btl_component = &mca_btl_udbtl_component.super,
    .btl_flags = MCA_BTL_FLAGS_SEND,
    .btl_add_procs = udbtl_add_procs,
    .btl_del_procs = udbtl_del_procs,
    .btl_register = udbtl_register_tag,
    .btl_finalize = udbtl_finalize,
    .btl_alloc = udbtl_alloc,
    .btl_free = udbtl_free,
    .btl_prepare_src = udbtl_prepare_src,
    .btl_send = udbtl_send,
    .btl_sendi = udbtl_sendi,
    .btl_dump = udbtl_dump,
    .btl_register_error = udbtl_register_error,
    .btl_ft_event = udbtl_ft_event,
};

/* ----- component functions ---------------------------------------------- */

/* Values set through Open MPI (command line, environment, files); the rest
 * keep udbtl's defaults or its UDBTL_* environment. */
static const char **explicit_values(void)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    const char **values = calloc(c->num_params + 1, sizeof(char *));
    if (NULL == values) {
        return NULL;
    }
    for (size_t i = 0; i < c->num_params; ++i) {
        mca_base_var_source_t source = MCA_BASE_VAR_SOURCE_DEFAULT;
        if (param_index[i] >= 0
            && OPAL_SUCCESS == mca_base_var_get_value(param_index[i], NULL, &source, NULL)
            && MCA_BASE_VAR_SOURCE_DEFAULT != source) {
            values[i] = param_values[i];
        }
    }
    return values;
}

static mca_btl_base_module_t **udbtl_init(int *num_btls, bool enable_progress_threads,
                                          bool enable_mpi_threads)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    (void) enable_progress_threads;
    *num_btls = 0;
    if (enable_mpi_threads) {
        /* Shown with --mca btl_base_verbose 1, as other BTLs' reasons. */
        opal_output_verbose(1, opal_btl_base_framework.framework_output,
                            "btl udbtl: not used under MPI_THREAD_MULTIPLE "
                            "(it supports one thread in MPI at a time)");
        return NULL;
    }
    const char **values = explicit_values();
    if (NULL == values) {
        return NULL;
    }
    const opal_process_name_t me = OPAL_PROC_MY_NAME;
    char error[1024] = "";
    size_t count = 0;
    c->rs = udbtl_rs_init(values, me.jobid, me.vpid, &count, error, sizeof(error));
    free(values);
    if (NULL == c->rs) {
        opal_output(0,
                    "\n--------------------------------------------------------------------------\n"
                    "The udbtl BTL could not start on host %s, so it is not used:\n\n  %s\n"
                    "--------------------------------------------------------------------------",
                    opal_proc_local_get()->proc_hostname, error);
        return NULL;
    }
    c->modules = calloc(count, sizeof(udbtl_module_t *));
    if (NULL == c->modules) {
        return NULL;
    }
    for (size_t i = 0; i < count; ++i) {
        udbtl_module_t *m = calloc(1, sizeof(*m));
        if (NULL == m) {
            return NULL;
        }
        struct udbtl_rs_limits limits;
        memcpy(&m->super, &udbtl_module_template, sizeof(m->super));
        m->rs = udbtl_rs_module(c->rs, i, &limits);
        m->super.btl_eager_limit = limits.eager_limit;
        m->super.btl_rndv_eager_limit = limits.rndv_eager_limit;
        m->super.btl_max_send_size = limits.max_send_size;
        m->super.btl_exclusivity = limits.exclusivity;
        m->super.btl_bandwidth = limits.bandwidth;
        m->super.btl_latency = c->latency;
        c->modules[i] = m;
    }
    c->num_modules = count;

    uint8_t blob[4096];
    size_t len = udbtl_rs_modex(c->rs, blob, sizeof(blob));
    if (len > 0 && len <= sizeof(blob)) {
        int rc;
        OPAL_MODEX_SEND(rc, OPAL_PMIX_GLOBAL, &c->super.btl_version, blob, len);
        if (OPAL_SUCCESS != rc) {
            opal_output(0, "btl udbtl: publishing the address failed (%d)", rc);
        }
    }
    /* The BTL framework frees the array it is given; ours stays. */
    mca_btl_base_module_t **given = calloc(count, sizeof(*given));
    if (NULL == given) {
        return NULL;
    }
    for (size_t i = 0; i < count; ++i) {
        given[i] = &c->modules[i]->super;
    }
    *num_btls = (int) count;
    return given;
}

static int udbtl_progress(void)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    /* ob1 may call opal_progress from a callback; the events of an outer
     * pass are still being delivered then, in order, so an inner pass must
     * not overtake them. */
    static int depth = 0;
    if (depth > 0) {
        return 0;
    }
    ++depth;
    int count = 0;
    for (size_t i = 0; i < c->num_modules; ++i) {
        if (NULL != c->modules[i]) {
            count += udbtl_rs_progress(c->modules[i]->rs, c->modules[i]);
        }
    }
    --depth;
    return count;
}

static int udbtl_finalize(struct mca_btl_base_module_t *btl)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    udbtl_module_t *m = (udbtl_module_t *) btl;
    size_t i;
    /* Deliver what is left, so every fragment is back. */
    (void) udbtl_rs_progress(m->rs, m);
    if (c->print_stats) {
        char line[1024];
        (void) udbtl_rs_stats_line(m->rs, line, sizeof(line));
        fprintf(stderr, "udbtl-stats: rank=%u %s\n", (unsigned) OPAL_PROC_MY_NAME.vpid, line);
        fflush(stderr);
    }
    for (i = 0; i < c->num_modules && c->modules[i] != m; ++i) {
    }
    if (i < c->num_modules) {
        c->modules[i] = NULL;
    }
    while (NULL != m->all_frags) {
        udbtl_frag_t *next = m->all_frags->next_all;
        OBJ_DESTRUCT(&m->all_frags->base);
        free(m->all_frags);
        m->all_frags = next;
    }
    free(m);
    /* The transport goes when its last module does. */
    for (i = 0; i < c->num_modules && NULL == c->modules[i]; ++i) {
    }
    if (i == c->num_modules && NULL != c->rs) {
        char error[1024] = "";
        int rc = udbtl_rs_finalize(c->rs, error, sizeof(error));
        c->rs = NULL;
        free(c->modules);
        c->modules = NULL;
        c->num_modules = 0;
        if (UDBTL_RS_OK != rc) {
            opal_output(0, "btl udbtl: finalize: %s", error);
        }
    }
    return OPAL_SUCCESS;
}

udbtl_component_t mca_btl_udbtl_component = {
    .super = {
        .btl_version = {
            MCA_BTL_DEFAULT_VERSION("udbtl"),
            .mca_open_component = udbtl_open,
            .mca_close_component = udbtl_close,
            .mca_register_component_params = udbtl_register,
        },
        .btl_data = {
            .param_field = MCA_BASE_METADATA_PARAM_CHECKPOINT,
        },
        .btl_init = udbtl_init,
        .btl_progress = udbtl_progress,
    },
};

/* ----- called by Rust, from udbtl_rs_progress --------------------------- */

/* A message arrived: hand it to ob1's callback for its tag. The bytes stay
 * valid until this returns. Returns whether a callback took it (Rust counts
 * the rest). */
int udbtl_c_received(void *btl, uint8_t tag, const void *payload, size_t len)
{
    mca_btl_base_segment_t segment = {.seg_addr.pval = (void *) payload, .seg_len = len};
    mca_btl_base_descriptor_t des;
    memset(&des, 0, sizeof(des));
    des.des_segments = &segment;
    des.des_segment_count = 1;
    mca_btl_active_message_callback_t *reg = mca_btl_base_active_message_trigger + tag;
    if (NULL == reg->cbfunc) {
        return 0;
    }
    reg->cbfunc((mca_btl_base_module_t *) btl, tag, &des, reg->cbdata);
    return 1;
}

static void report_lost(udbtl_module_t *m, struct mca_btl_base_endpoint_t *ep, int fatal,
                        const char *message);

/* A send is over: acknowledged, or failed because its peer is lost. */
void udbtl_c_sent(void *btl, uint64_t context, int ok, int owned)
{
    udbtl_frag_t *frag = (udbtl_frag_t *) (uintptr_t) context;
    udbtl_module_t *m = (udbtl_module_t *) btl;
    /* Name the peer before ob1 hears of the failure: ob1 aborts the job
     * from its completion callback too. */
    if (!ok && NULL != frag->endpoint) {
        report_lost(m, frag->endpoint, 1, "a send to it could not be delivered");
    }
    if (!frag->silent && NULL != frag->base.des_cbfunc) {
        frag->base.des_cbfunc(&m->super, frag->endpoint, &frag->base,
                              ok ? OPAL_SUCCESS : OPAL_ERR_UNREACH);
    }
    /* Rust frees its side of an owned fragment after this returns. */
    if (owned) {
        frag_put(frag);
    }
}

/* Tells ob1's error handler, which aborts the job with the message. */
static void report_lost(udbtl_module_t *m, struct mca_btl_base_endpoint_t *ep, int fatal,
                        const char *message)
{
    char text[1024];
    if (NULL != ep) {
        if (ep->lost) {
            return;
        }
        ep->lost = true;
        snprintf(text, sizeof(text), "btl udbtl on %s (rank %u): lost contact with rank %u on %s: %s",
                 opal_proc_local_get()->proc_hostname, (unsigned) OPAL_PROC_MY_NAME.vpid,
                 (unsigned) ep->proc->proc_name.vpid,
                 NULL != ep->proc->proc_hostname ? ep->proc->proc_hostname : "an unknown host",
                 message);
    } else {
        snprintf(text, sizeof(text), "btl udbtl on %s (rank %u): %s",
                 opal_proc_local_get()->proc_hostname, (unsigned) OPAL_PROC_MY_NAME.vpid,
                 message);
    }
    opal_output(0, "%s", text);
    if (NULL != m->error_cb) {
        m->error_cb(&m->super, fatal || NULL != ep ? MCA_BTL_ERROR_FLAGS_FATAL
                                                   : MCA_BTL_ERROR_FLAGS_NONFATAL,
                    NULL != ep ? ep->proc : NULL, text);
    }
}

/* The transport lost a peer (`endpoint_context` is its endpoint), or
 * failed (0). */
void udbtl_c_error(void *btl, uint64_t endpoint_context, int fatal, const char *message)
{
    report_lost((udbtl_module_t *) btl,
                (struct mca_btl_base_endpoint_t *) (uintptr_t) endpoint_context, fatal, message);
}
