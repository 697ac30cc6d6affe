/*
 * mca_btl_udbtl: descriptors and sends, and ob1's flow control.
 *
 * ob1 retries what a BTL refused (a descriptor it could not get, a send
 * queued for resources) only from its completion callbacks. A BTL whose
 * sends all complete at once (send returns 1, no callback later) can leave
 * ob1 waiting for a callback that never comes: the hang of Open MPI issue
 * #3845, under load. So:
 *
 *  - an owned, one-segment send completes at once only while fewer than
 *    `silent_max` sends are outstanding; from there on its callback comes
 *    at the acknowledgement. Silent sends therefore never exceed
 *    `silent_max`, and whenever the module refuses anything (at
 *    `throttle_at` or more outstanding, or with every fragment taken), more
 *    than `throttle_at - silent_max` sends are outstanding whose callbacks
 *    are still to come: ob1 always hears again, and retries;
 *  - prepare_src refuses from `throttle_at` outstanding sends on, so that a
 *    large transfer queues in ob1 instead of taking every fragment;
 *  - allocations without MCA_BTL_DES_FLAGS_PRIORITY leave a reserve of
 *    fragments for those with it (ob1's control messages);
 *  - sendi completes at once only below `silent_max`; above, it hands ob1
 *    an empty descriptor to send the normal way, with a callback.
 *
 * With MCA_BTL_FLAGS_SEND_INPLACE (on by default), ob1 hands eager
 * messages to prepare_src, which copies them into a fragment (complete at
 * once) or, in a stream, lends the user's buffer (complete at the
 * acknowledgement). A stream is `lend_after` or more sends to the same peer
 * outstanding: its peer is receiving, so acknowledgements come back within
 * a round trip, and the copy was the sending side's largest cost of its own
 * (osu bandwidth at 32 KiB across the veth). A lone message, as in a halo
 * exchange, is copied: a lent one would wait for its acknowledgement, a
 * scheduler time slice where ranks share CPUs.
 */

#include "udbtl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ----- descriptors ------------------------------------------------------ */

/* A send handed to Rust, counted for ob1's flow control and its peer's
 * stream, and the undoing of it. Called with the module locked. */
static inline void count_send(udbtl_module_t *m, udbtl_endpoint_t *endpoint)
{
    ++m->outstanding;
    ++endpoint->outstanding;
}

static inline void uncount_send(udbtl_module_t *m, udbtl_endpoint_t *endpoint)
{
    --m->outstanding;
    --endpoint->outstanding;
}

/* A wrapper from the free list, or a new one; NULL when out of memory.
 * Called with the module locked. */
static udbtl_frag_t *frag_wrapper(udbtl_module_t *m)
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
    frag->counted = false;
    frag->silent = false;
    return frag;
}

/* Gives a wrapper back, and its fragment's count. Called with the module
 * locked. */
static void frag_release(udbtl_frag_t *frag)
{
    udbtl_module_t *m = frag->module;
    if (frag->counted) {
        --m->frags_in_use;
        frag->counted = false;
    }
    frag->next_free = m->free_frags;
    m->free_frags = frag;
}

/* A descriptor with room for `size` bytes in a Rust send fragment, or NULL:
 * none free, or only the reserve left and this is no PRIORITY allocation. */
static udbtl_frag_t *frag_alloc(udbtl_module_t *m, uint8_t order, size_t size, uint32_t flags)
{
    size_t reserve = m->send_frags_max / 8;
    OPAL_THREAD_LOCK(&m->lock);
    size_t bound = (flags & MCA_BTL_DES_FLAGS_PRIORITY) ? m->send_frags_max
                                                         : m->send_frags_max - reserve;
    udbtl_frag_t *frag = m->frags_in_use < bound ? frag_wrapper(m) : NULL;
    if (NULL != frag) {
        frag->counted = true;
        ++m->frags_in_use;
    }
    OPAL_THREAD_UNLOCK(&m->lock);
    if (NULL == frag) {
        return NULL;
    }
    void *data;
    if (UDBTL_RS_OK != udbtl_rs_alloc(m->rs, order, size, &frag->des, &data)) {
        OPAL_THREAD_LOCK(&m->lock);
        frag_release(frag);
        OPAL_THREAD_UNLOCK(&m->lock);
        return NULL;
    }
    frag->segments[0].seg_addr.pval = data;
    frag->segments[0].seg_len = size;
    frag->base.des_flags = flags;
    frag->base.order = order;
    return frag;
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
    udbtl_module_t *m = (udbtl_module_t *) btl;
    udbtl_frag_t *frag = (udbtl_frag_t *) des;
    if (UDBTL_RS_OK != udbtl_rs_free(m->rs, frag->des)) {
        return OPAL_ERROR;
    }
    OPAL_THREAD_LOCK(&m->lock);
    frag_release(frag);
    OPAL_THREAD_UNLOCK(&m->lock);
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
    OPAL_THREAD_LOCK(&m->lock);
    udbtl_frag_t *frag = frag_wrapper(m);
    OPAL_THREAD_UNLOCK(&m->lock);
    void *header;
    if (NULL != frag
        && UDBTL_RS_OK
               != udbtl_rs_prepare_lent(m->rs, order, reserve, iov.iov_base, taken, &frag->des,
                                        &header)) {
        OPAL_THREAD_LOCK(&m->lock);
        frag_release(frag);
        OPAL_THREAD_UNLOCK(&m->lock);
        frag = NULL;
    }
    if (NULL == frag) {
        opal_convertor_set_position(convertor, &position);
        return NULL;
    }
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
 * so the user's buffer is free at once. NULL while the module throttles
 * (ob1 queues the send and retries at a completion).
 *
 * ob1 calls this for an eager message (MCA_BTL_FLAGS_SEND_INPLACE), asking
 * for at most the eager limit less its header and sending whatever comes
 * back as the whole message, and for the fragments of a rendezvous, asking
 * for up to max_send_size and scheduling the rest. So a request that fits
 * the eager limit is taken whole, and only a longer one may be cut. */
static mca_btl_base_descriptor_t *udbtl_prepare_src(struct mca_btl_base_module_t *btl,
                                                    struct mca_btl_base_endpoint_t *endpoint,
                                                    struct opal_convertor_t *convertor,
                                                    uint8_t order, size_t reserve, size_t *size,
                                                    uint32_t flags)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    OPAL_THREAD_LOCK(&m->lock);
    bool throttled = m->outstanding >= m->throttle_at;
    bool stream = endpoint->outstanding >= mca_btl_udbtl_component.lend_after;
    size_t datagram = m->datagram;
    OPAL_THREAD_UNLOCK(&m->lock);
    if (throttled) {
        return NULL;
    }
    size_t want = *size;
    size_t eager = btl->btl_eager_limit;
    /* Contiguous data that does not fit one datagram's fragment is sent
     * from the user's buffer, as a train of datagrams: copying it would take
     * one fragment, and one ob1 fragment, per datagram. Such a train may be
     * as long as a fragment or an eager message, whichever is longer, so an
     * eager message always goes whole. What fits the eager limit is lent
     * only in a stream (see the top of this file), and copied otherwise. */
    size_t max = btl->btl_max_send_size > eager ? btl->btl_max_send_size : eager;
    bool fits = reserve + want <= eager;
    if (reserve < max && reserve + want > datagram && (stream || !fits)
        && 0 == opal_convertor_need_buffers(convertor)) {
        size_t lent = want < max - reserve ? want : max - reserve;
        udbtl_frag_t *frag = prepare_zero_copy(m, convertor, order, reserve, lent, flags);
        if (NULL != frag) {
            *size = frag->segments[1].seg_len;
            frag->endpoint = endpoint;
            if (fits) {
                __atomic_fetch_add(&m->eager_lent, 1, __ATOMIC_RELAXED);
            }
            return &frag->base;
        }
    }
    /* Packed data goes into a fragment of up to the eager limit (past one
     * datagram, a bounce buffer). */
    if (reserve > eager) {
        return NULL;
    }
    if (want > eager - reserve) {
        want = eager - reserve;
    }
    udbtl_frag_t *frag = frag_alloc(m, order, reserve + want, flags);
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

/* ----- sends ------------------------------------------------------------ */

/* Hands a descriptor to Rust. `silent`: it completes for ob1 now. */
static int frag_send(udbtl_module_t *m, udbtl_endpoint_t *endpoint, udbtl_frag_t *frag,
                     mca_btl_base_tag_t tag, bool owned, bool silent)
{
    frag->silent = silent;
    frag->endpoint = endpoint;
    int rc = udbtl_rs_send(m->rs, endpoint->id, frag->des, frag->segments[0].seg_len, tag, owned,
                           (uint64_t) (uintptr_t) frag);
    if (UDBTL_RS_OK != rc) {
        OPAL_THREAD_LOCK(&m->lock);
        uncount_send(m, endpoint);
        OPAL_THREAD_UNLOCK(&m->lock);
        frag->silent = false;
        return UDBTL_RS_UNREACH == rc ? OPAL_ERR_UNREACH : OPAL_ERROR;
    }
    return OPAL_SUCCESS;
}

static int udbtl_send(struct mca_btl_base_module_t *btl,
                      struct mca_btl_base_endpoint_t *endpoint,
                      struct mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    udbtl_frag_t *frag = (udbtl_frag_t *) des;
    bool owned = 0 != (des->des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP);
    /* The bytes of an owned one-segment descriptor are in our fragment,
     * kept until acknowledged: for ob1 it may be complete now, as a send
     * that went out inline. Data read from the user's buffer, a callback
     * ob1 insists on, or a module near its limits completes at the
     * acknowledgement instead (see the top of this file). */
    bool may_be_silent = owned && 1 == des->des_segment_count
                         && 0 == (des->des_flags & MCA_BTL_DES_SEND_ALWAYS_CALLBACK);
    OPAL_THREAD_LOCK(&m->lock);
    bool silent = may_be_silent && m->outstanding < m->silent_max;
    count_send(m, endpoint);
    OPAL_THREAD_UNLOCK(&m->lock);
    int rc = frag_send(m, endpoint, frag, tag, owned, silent);
    if (OPAL_SUCCESS != rc) {
        return rc;
    }
    return silent ? 1 : OPAL_SUCCESS;
}

/* The inline fast path: header and data packed into one fragment and sent,
 * complete for the caller on return. Near the module's limits it hands ob1
 * an empty descriptor instead, to send the normal way. */
static int udbtl_sendi(struct mca_btl_base_module_t *btl,
                       struct mca_btl_base_endpoint_t *endpoint,
                       struct opal_convertor_t *convertor, void *header, size_t header_size,
                       size_t payload_size, uint8_t order, uint32_t flags,
                       mca_btl_base_tag_t tag, mca_btl_base_descriptor_t **descriptor)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    size_t total = header_size + payload_size;
    if (NULL != descriptor) {
        *descriptor = NULL;
    }
    if (total > btl->btl_eager_limit) {
        return OPAL_ERR_RESOURCE_BUSY;
    }
    udbtl_frag_t *frag = frag_alloc(m, order, total, flags | MCA_BTL_DES_FLAGS_BTL_OWNERSHIP);
    if (NULL == frag) {
        return OPAL_ERR_RESOURCE_BUSY;
    }
    frag->endpoint = endpoint;
    OPAL_THREAD_LOCK(&m->lock);
    bool silent = m->outstanding < m->silent_max;
    if (silent) {
        count_send(m, endpoint);
    }
    OPAL_THREAD_UNLOCK(&m->lock);
    if (!silent) {
        /* ob1 packs the header and data into it and sends it. */
        if (NULL == descriptor) {
            (void) udbtl_free(btl, &frag->base);
        } else {
            *descriptor = &frag->base;
        }
        return OPAL_ERR_RESOURCE_BUSY;
    }
    size_t position = convertor->bConverted;
    memcpy(frag->segments[0].seg_addr.pval, header, header_size);
    if (payload_size > 0) {
        struct iovec iov = {.iov_base = (char *) frag->segments[0].seg_addr.pval + header_size,
                            .iov_len = payload_size};
        uint32_t iov_count = 1;
        size_t packed = payload_size;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &packed) < 0
            || packed != payload_size) {
            OPAL_THREAD_LOCK(&m->lock);
            uncount_send(m, endpoint);
            OPAL_THREAD_UNLOCK(&m->lock);
            opal_convertor_set_position(convertor, &position);
            (void) udbtl_free(btl, &frag->base);
            return OPAL_ERROR;
        }
    }
    int rc = frag_send(m, endpoint, frag, tag, true, true);
    if (OPAL_SUCCESS != rc) {
        /* The convertor goes back to where ob1 left it. */
        opal_convertor_set_position(convertor, &position);
        (void) udbtl_free(btl, &frag->base);
        return rc;
    }
    return OPAL_SUCCESS;
}

/* A send is over: acknowledged, or failed because its peer is lost.
 * Called by Rust from progress, with no lock held. */
void udbtl_c_sent(void *btl, uint64_t context, int ok, int owned)
{
    udbtl_frag_t *frag = (udbtl_frag_t *) (uintptr_t) context;
    udbtl_module_t *m = (udbtl_module_t *) btl;
    /* Name the peer before ob1 hears of the failure: ob1 aborts the job
     * from its completion callback too. */
    if (!ok && NULL != frag->endpoint) {
        udbtl_report_lost(m, frag->endpoint, 1, "a send to it could not be delivered");
    }
    if (!frag->silent && NULL != frag->base.des_cbfunc) {
        frag->base.des_cbfunc(&m->super, frag->endpoint, &frag->base,
                              ok ? OPAL_SUCCESS : OPAL_ERR_UNREACH);
    }
    OPAL_THREAD_LOCK(&m->lock);
    uncount_send(m, frag->endpoint);
    /* Rust frees its side of an owned fragment after this returns. */
    if (owned) {
        frag_release(frag);
    }
    OPAL_THREAD_UNLOCK(&m->lock);
}

/* ----- the module ------------------------------------------------------- */

/* Frees every descriptor wrapper; at finalize, when nothing uses them. */
void udbtl_module_free_frags(udbtl_module_t *m)
{
    while (NULL != m->all_frags) {
        udbtl_frag_t *next = m->all_frags->next_all;
        OBJ_DESTRUCT(&m->all_frags->base);
        free(m->all_frags);
        m->all_frags = next;
    }
    m->free_frags = NULL;
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

const mca_btl_base_module_t udbtl_module_template = {
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
