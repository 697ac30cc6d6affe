/*
 * mca_btl_udbtl: the component. Its variables (params.c), starting the
 * transport on the interfaces the job's placement calls for, progress, and
 * a module's finalize. See udbtl.h for how the files divide the work.
 */

#include "udbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opal/mca/pmix/pmix.h"
#include "opal/util/output.h"

static int udbtl_register(void)
{
    return udbtl_params_register(&mca_btl_udbtl_component);
}

static int udbtl_open(void)
{
    return OPAL_SUCCESS;
}

static int udbtl_close(void)
{
    return OPAL_SUCCESS;
}

/* The number of processes in this process's job, or 0 if Open MPI does not
 * say. */
static uint32_t job_size(void)
{
    opal_process_name_t job = OPAL_PROC_MY_NAME;
    job.vpid = OPAL_VPID_WILDCARD;
    /* The value is unloaded into the storage the pointer points at. */
    uint32_t size = 0, *into = &size;
    int rc;
    OPAL_MODEX_RECV_VALUE_OPTIONAL(rc, OPAL_PMIX_JOB_SIZE, &job, &into, OPAL_UINT32);
    return OPAL_SUCCESS == rc ? size : 0;
}

/* Who this process is and where its job runs: every process on this host
 * (loopback only), or some elsewhere (every interface but loopback). */
static void identify(struct udbtl_rs_identity *who)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    const opal_process_name_t me = OPAL_PROC_MY_NAME;
    int32_t local_peers = opal_process_info.num_local_peers;
    int32_t local_rank = opal_process_info.my_local_rank;
    c->job_size = job_size();
    who->job_id = me.jobid;
    who->vpid = me.vpid;
    who->local_rank = local_rank > 0 ? (uint32_t) local_rank : 0;
    /* A job of unknown size is taken to span hosts: that works on one host
     * too, at some cost, where the reverse would not work at all. */
    who->one_host = c->job_size > 0 && (uint32_t) (local_peers > 0 ? local_peers : 0) + 1
                                            >= c->job_size;
}

/* Releases modules 0..count-1 and the transport after a failed start. */
static void abandon(udbtl_component_t *c, size_t count)
{
    for (size_t i = 0; i < count; ++i) {
        if (NULL != c->modules[i]) {
            OBJ_DESTRUCT(&c->modules[i]->lock);
            free(c->modules[i]);
        }
    }
    free(c->modules);
    c->modules = NULL;
    c->num_modules = 0;
    char error[256] = "";
    (void) udbtl_rs_finalize(c->rs, error, sizeof(error));
    c->rs = NULL;
}

static mca_btl_base_module_t **udbtl_init(int *num_btls, bool enable_progress_threads,
                                          bool enable_mpi_threads)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    /* Every thread level is served (see udbtl.h); progress threads are
     * Open MPI's own business. */
    (void) enable_progress_threads;
    (void) enable_mpi_threads;
    *num_btls = 0;
    char **values = udbtl_params_explicit();
    if (NULL == values) {
        return NULL;
    }
    c->local_host = c->single_copy ? udbtl_rs_memory_domain() : 0;
    c->local_pid = (int32_t) getpid();
    struct udbtl_rs_identity who;
    identify(&who);
    char error[1024] = "";
    size_t count = 0;
    c->rs = udbtl_rs_init((const char *const *) values, &who, &count, error, sizeof(error));
    udbtl_params_free_explicit(values);
    if (NULL == c->rs) {
        opal_output(0,
                    "\n--------------------------------------------------------------------------\n"
                    "The udbtl BTL could not start on host %s, so it is not used:\n\n  %s\n"
                    "--------------------------------------------------------------------------",
                    opal_proc_local_get()->proc_hostname, error);
        return NULL;
    }
    c->modules = calloc(count, sizeof(udbtl_module_t *));
    mca_btl_base_module_t **given = calloc(count, sizeof(*given));
    if (NULL == c->modules || NULL == given) {
        free(given);
        abandon(c, 0);
        return NULL;
    }
    for (size_t i = 0; i < count; ++i) {
        udbtl_module_t *m = calloc(1, sizeof(*m));
        if (NULL == m) {
            free(given);
            abandon(c, i);
            return NULL;
        }
        memcpy(&m->super, &udbtl_module_template, sizeof(m->super));
        OBJ_CONSTRUCT(&m->lock, opal_mutex_t);
        m->rs = udbtl_rs_module(c->rs, i);
        c->modules[i] = m;
        udbtl_module_apply_limits(m);
        given[i] = &m->super;
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
    *num_btls = (int) count;
    return given;
}

/* One pass over every module. Rust skips modules idle for a while on most
 * calls (no system call then), and lets one thread at a time deliver a
 * module's events: an inner call, from one of ob1's callbacks, or another
 * thread's returns at once. */
static int udbtl_progress(void)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    int count = 0;
    for (size_t i = 0; i < c->num_modules; ++i) {
        udbtl_module_t *m = c->modules[i];
        if (NULL != m) {
            count += udbtl_rs_progress(m->rs, m);
        }
    }
    return count;
}

int udbtl_finalize(struct mca_btl_base_module_t *btl)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    udbtl_module_t *m = (udbtl_module_t *) btl;
    size_t i;
    /* ob1 is gone: what is left is read and dropped, without callbacks. */
    (void) udbtl_rs_drain(m->rs);
    if (c->print_stats) {
        char line[1024];
        (void) udbtl_rs_stats_line(m->rs, line, sizeof(line));
        fprintf(stderr, "udbtl-stats: rank=%u %s gets_local=%llu eager_lent=%llu\n",
                (unsigned) OPAL_PROC_MY_NAME.vpid, line,
                (unsigned long long) __atomic_load_n(&m->gets_local, __ATOMIC_RELAXED),
                (unsigned long long) __atomic_load_n(&m->eager_lent, __ATOMIC_RELAXED));
        fflush(stderr);
    }
    for (i = 0; i < c->num_modules && c->modules[i] != m; ++i) {
    }
    if (i < c->num_modules) {
        c->modules[i] = NULL;
    }
    udbtl_module_free_frags(m);
    udbtl_module_free_gets(m);
    udbtl_module_free_endpoints(m);
    OBJ_DESTRUCT(&m->lock);
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

/* A record of udbtl's log (Rust's `tracing`): errors and warnings for
 * everyone, the rest at btl_base_verbose levels. */
void udbtl_c_log(int level, const char *message)
{
    const opal_proc_t *self = opal_proc_local_get();
    const char *host = NULL != self && NULL != self->proc_hostname ? self->proc_hostname : "?";
    unsigned vpid = NULL != self ? (unsigned) self->proc_name.vpid : 0;
    switch (level) {
    case 1:
        opal_output(0, "btl udbtl on %s (rank %u): error: %s", host, vpid, message);
        break;
    case 2:
        opal_output(0, "btl udbtl on %s (rank %u): warning: %s", host, vpid, message);
        break;
    default:
        opal_output_verbose(level <= 3 ? 5 : level == 4 ? 20 : 50,
                            opal_btl_base_framework.framework_output,
                            "btl udbtl on %s (rank %u): %s", host, vpid, message);
        break;
    }
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
