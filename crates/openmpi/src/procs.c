/*
 * mca_btl_udbtl: peers. Adding them (from ob1, or on first contact),
 * deleting them, and telling ob1 when one is lost.
 *
 * Open MPI 4.1 adds remote processes lazily (mpi_add_procs_cutoff=0): a
 * process may hear from a peer that its ob1 never added. udbtl drops a
 * datagram from a sender it does not know, and the sender retransmits; so
 * each progress pass hands the senders it did not know (by vpid) to
 * udbtl_c_adopt, which adds them as Open MPI's tcp BTL does on first
 * contact (opal_proc_for_name, then this BTL's own add). When ob1 later
 * adds the process itself, it gets the same endpoint.
 *
 * Endpoints live until their module is finalized: a send to a deleted peer
 * may still complete, or fail, and name it.
 */

#include "udbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/mca/pmix/pmix.h"
#include "opal/util/output.h"

static bool same_job(const opal_proc_t *proc)
{
    return proc->proc_name.jobid == OPAL_PROC_MY_NAME.jobid;
}

/* The live endpoint of `proc` on `m`, or NULL. Called with `m` locked. */
static udbtl_endpoint_t *endpoint_find(udbtl_module_t *m, const opal_proc_t *proc)
{
    if (same_job(proc)) {
        uint32_t vpid = proc->proc_name.vpid;
        return vpid < m->by_vpid_len ? m->by_vpid[vpid] : NULL;
    }
    for (udbtl_endpoint_t *ep = m->all_endpoints; NULL != ep; ep = ep->next_all) {
        if (!ep->deleted && 0 == opal_compare_proc(ep->proc->proc_name, proc->proc_name)) {
            return ep;
        }
    }
    return NULL;
}

/* Records a new endpoint. Called with `m` locked. Returns false when out of
 * memory (the endpoint is then only in the list of every endpoint). */
static bool endpoint_insert(udbtl_module_t *m, udbtl_endpoint_t *ep)
{
    ep->next_all = m->all_endpoints;
    m->all_endpoints = ep;
    if (!same_job(ep->proc)) {
        return true;
    }
    uint32_t vpid = ep->proc->proc_name.vpid;
    if (vpid >= m->by_vpid_len) {
        size_t len = m->by_vpid_len > 0 ? m->by_vpid_len : 64;
        while (len <= vpid) {
            len *= 2;
        }
        udbtl_endpoint_t **grown = realloc(m->by_vpid, len * sizeof(*grown));
        if (NULL == grown) {
            return false;
        }
        memset(grown + m->by_vpid_len, 0, (len - m->by_vpid_len) * sizeof(*grown));
        m->by_vpid = grown;
        m->by_vpid_len = len;
    }
    m->by_vpid[vpid] = ep;
    return true;
}

/* The endpoint of `proc` on `m`: the one it has, or a new one from the
 * address `proc` published. NULL with `*status` UDBTL_RS_UNREACH when this
 * module does not take the peer, UDBTL_RS_ERROR on failure. No lock is
 * held across the calls into Open MPI and Rust: an add made meanwhile by
 * another thread, or from inside this one, is found by Rust, which hands
 * back its endpoint. */
static udbtl_endpoint_t *endpoint_for(udbtl_module_t *m, opal_proc_t *proc, int *status)
{
    OPAL_THREAD_LOCK(&m->lock);
    udbtl_endpoint_t *ep = endpoint_find(m, proc);
    OPAL_THREAD_UNLOCK(&m->lock);
    if (NULL != ep) {
        return ep;
    }
    uint8_t *blob = NULL;
    size_t size = 0;
    int rc;
    OPAL_MODEX_RECV(rc, &mca_btl_udbtl_component.super.btl_version, &proc->proc_name,
                    (void **) &blob, &size);
    if (OPAL_SUCCESS != rc || NULL == blob) {
        /* It published no address: unreachable through udbtl, which is not
         * an error (another BTL may reach it). */
        *status = UDBTL_RS_UNREACH;
        return NULL;
    }
    ep = calloc(1, sizeof(*ep));
    if (NULL == ep) {
        free(blob);
        *status = UDBTL_RS_ERROR;
        return NULL;
    }
    ep->proc = proc;
    ep->module = m;
    uint64_t existing = 0;
    *status = udbtl_rs_add_proc(m->rs, blob, size, proc->proc_name.jobid, proc->proc_name.vpid,
                                same_job(proc), (uint64_t) (uintptr_t) ep, &ep->id, &existing);
    free(blob);
    if (UDBTL_RS_OK != *status) {
        free(ep);
        return NULL;
    }
    if (existing != (uint64_t) (uintptr_t) ep) {
        free(ep);
        return (udbtl_endpoint_t *) (uintptr_t) existing;
    }
    OPAL_THREAD_LOCK(&m->lock);
    bool indexed = endpoint_insert(m, ep);
    OPAL_THREAD_UNLOCK(&m->lock);
    if (!indexed) {
        *status = UDBTL_RS_ERROR;
        return NULL;
    }
    return ep;
}

int udbtl_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs, struct opal_proc_t **procs,
                    struct mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    const opal_proc_t *self = opal_proc_local_get();
    for (size_t i = 0; i < nprocs; ++i) {
        opal_proc_t *proc = procs[i];
        /* The self BTL serves this process. */
        if (proc == self || 0 == opal_compare_proc(proc->proc_name, self->proc_name)) {
            continue;
        }
        int status = UDBTL_RS_OK;
        udbtl_endpoint_t *ep = endpoint_for(m, proc, &status);
        if (NULL == ep) {
            if (UDBTL_RS_ERROR == status) {
                opal_output_verbose(1, opal_btl_base_framework.framework_output,
                                    "btl udbtl: could not add a peer; it is unreachable "
                                    "through udbtl");
            }
            continue;
        }
        peers[i] = ep;
        if (NULL != reachable) {
            opal_bitmap_set_bit(reachable, (int) i);
        }
    }
    udbtl_module_apply_limits(m);
    return OPAL_SUCCESS;
}

int udbtl_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs, struct opal_proc_t **procs,
                    struct mca_btl_base_endpoint_t **peers)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    (void) procs;
    for (size_t i = 0; i < nprocs; ++i) {
        udbtl_endpoint_t *ep = peers[i];
        if (NULL == ep || ep->module != m) {
            continue;
        }
        OPAL_THREAD_LOCK(&m->lock);
        bool was_live = !ep->deleted;
        ep->deleted = true;
        if (same_job(ep->proc) && ep->proc->proc_name.vpid < m->by_vpid_len
            && m->by_vpid[ep->proc->proc_name.vpid] == ep) {
            m->by_vpid[ep->proc->proc_name.vpid] = NULL;
        }
        OPAL_THREAD_UNLOCK(&m->lock);
        if (was_live) {
            (void) udbtl_rs_del_proc(m->rs, ep->id);
        }
    }
    return OPAL_SUCCESS;
}

/* A process of this job that sent to this one before being added here:
 * added now, so that its retransmissions are accepted. Called by Rust from
 * progress, with no lock held. A vpid outside the job is ignored (so is a
 * process Open MPI cannot name). */
void udbtl_c_adopt(void *btl, uint32_t vpid)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    uint32_t job_size = mca_btl_udbtl_component.job_size;
    opal_process_name_t name = OPAL_PROC_MY_NAME;
    if (vpid == name.vpid || (job_size > 0 && vpid >= job_size)) {
        return;
    }
    name.vpid = vpid;
    OPAL_THREAD_LOCK(&m->lock);
    bool known = vpid < m->by_vpid_len && NULL != m->by_vpid[vpid];
    OPAL_THREAD_UNLOCK(&m->lock);
    if (known) {
        return;
    }
    opal_proc_t *proc = opal_proc_for_name(name);
    if (NULL == proc) {
        opal_output_verbose(1, opal_btl_base_framework.framework_output,
                            "btl udbtl: rank %u sent first, but Open MPI does not know it",
                            (unsigned) vpid);
        return;
    }
    int status = UDBTL_RS_OK;
    udbtl_endpoint_t *ep = endpoint_for(m, proc, &status);
    opal_output_verbose(10, opal_btl_base_framework.framework_output,
                        "btl udbtl: rank %u sent first: %s", (unsigned) vpid,
                        NULL != ep ? "added" : "not reachable through this module");
    udbtl_module_apply_limits(m);
}

/* Tells ob1's error handler, which aborts the job with the message. A
 * peer's loss is told once, and not at all once ob1 deleted the peer. */
void udbtl_report_lost(udbtl_module_t *m, udbtl_endpoint_t *ep, int fatal, const char *message)
{
    char text[1024];
    const opal_proc_t *self = opal_proc_local_get();
    if (NULL != ep) {
        OPAL_THREAD_LOCK(&m->lock);
        bool quiet = ep->lost || ep->deleted;
        ep->lost = true;
        OPAL_THREAD_UNLOCK(&m->lock);
        if (quiet) {
            return;
        }
        snprintf(text, sizeof(text), "btl udbtl on %s (rank %u): lost contact with rank %u on %s: %s",
                 self->proc_hostname, (unsigned) self->proc_name.vpid,
                 (unsigned) ep->proc->proc_name.vpid,
                 NULL != ep->proc->proc_hostname ? ep->proc->proc_hostname : "an unknown host",
                 message);
    } else {
        snprintf(text, sizeof(text), "btl udbtl on %s (rank %u): %s", self->proc_hostname,
                 (unsigned) self->proc_name.vpid, message);
    }
    opal_output(0, "%s", text);
    if (NULL != m->error_cb) {
        m->error_cb(&m->super,
                    fatal || NULL != ep ? MCA_BTL_ERROR_FLAGS_FATAL : MCA_BTL_ERROR_FLAGS_NONFATAL,
                    NULL != ep ? ep->proc : NULL, text);
    }
}

/* The transport lost a peer (`endpoint_context` is its endpoint), or
 * failed (0). Called by Rust from progress, with no lock held. */
void udbtl_c_error(void *btl, uint64_t endpoint_context, int fatal, const char *message)
{
    udbtl_report_lost((udbtl_module_t *) btl,
                      (udbtl_endpoint_t *) (uintptr_t) endpoint_context, fatal, message);
}

/* A message arrived: hand it to ob1's callback for its tag. The bytes stay
 * valid until this returns. Returns whether a callback took it (Rust counts
 * the rest). Called by Rust from progress, with no lock held. The tag comes
 * off the wire: Open MPI's table has MCA_BTL_TAG_MAX (255) entries, so the
 * one value a byte holds past it must not index it. */
int udbtl_c_received(void *btl, uint8_t tag, const void *payload, size_t len)
{
    if (tag >= MCA_BTL_TAG_MAX) {
        return 0;
    }
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

/* Frees every endpoint; at finalize, when nothing refers to them. */
void udbtl_module_free_endpoints(udbtl_module_t *m)
{
    while (NULL != m->all_endpoints) {
        udbtl_endpoint_t *next = m->all_endpoints->next_all;
        free(m->all_endpoints);
        m->all_endpoints = next;
    }
    free(m->by_vpid);
    m->by_vpid = NULL;
    m->by_vpid_len = 0;
}
