/*
 * mca_btl_udbtl: get, emulated over udbtl's reliable stream.
 *
 * ob1 reads a large contiguous message with the RGET protocol when its BTL
 * can get: the sender registers its buffer (REMOTE_READ) and sends the
 * handle in its RGET header; the receiver gets the bytes, up to
 * btl_get_limit at a time, straight into its receive buffer, then sends
 * FIN. udbtl's get is a small request to the sender's BTL, which answers
 * with one reply that leaves as a train of datagrams gathered from the
 * registered buffer; the reader copies each datagram into the receive
 * buffer as it is delivered. No ob1 fragment carries the data, nothing is
 * copied on the sending side, and nothing is reassembled.
 *
 * Between two processes of one host, the reader copies the bytes straight
 * from the owner's memory instead (local_read.c).
 *
 * A handle carries the key of the Rust region (registered only for
 * REMOTE_READ; every local registration shares one handle of key 0). The
 * sender deregisters on FIN, which the reader sends after the last reply
 * datagram and which acknowledges it, so no reply is resent from memory
 * that ob1 gave back.
 */

#include "udbtl.h"

#include <stdlib.h>

/* ----- registration ----------------------------------------------------- */

/* The handle of every registration without REMOTE_READ: a get's local
 * buffer needs nothing from udbtl, and ob1 registers one per get, so it
 * costs no allocation. */
static mca_btl_base_registration_handle_t local_only = {.key = 0, .host = 0};

static mca_btl_base_registration_handle_t *
udbtl_register_mem(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                   void *base, size_t size, uint32_t flags)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    (void) endpoint;
    if (0 == (flags & MCA_BTL_REG_FLAG_REMOTE_READ)) {
        return &local_only;
    }
    mca_btl_base_registration_handle_t *handle = malloc(sizeof(*handle));
    if (NULL == handle) {
        return NULL;
    }
    if (UDBTL_RS_OK != udbtl_rs_register(m->rs, base, size, &handle->key)) {
        free(handle);
        return NULL;
    }
    udbtl_local_stamp(handle);
    return handle;
}

static int udbtl_deregister_mem(struct mca_btl_base_module_t *btl,
                                mca_btl_base_registration_handle_t *handle)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    if (&local_only == handle) {
        return OPAL_SUCCESS;
    }
    int rc = OPAL_SUCCESS;
    if (UDBTL_RS_OK != udbtl_rs_deregister(m->rs, handle->key)) {
        rc = OPAL_ERROR;
    }
    free(handle);
    return rc;
}

/* ----- gets ------------------------------------------------------------- */

/* A get in flight: what its completion callback needs. */
typedef struct udbtl_get {
    mca_btl_base_rdma_completion_fn_t cbfunc;
    void *cbcontext;
    void *cbdata;
    void *local_address;
    mca_btl_base_registration_handle_t *local_handle;
    udbtl_endpoint_t *endpoint;
    struct udbtl_get *next_free;
    struct udbtl_get *next_all;
} udbtl_get_t;

/* A get record from the free list, or a new one; NULL when out of memory. */
static udbtl_get_t *get_record(udbtl_module_t *m)
{
    OPAL_THREAD_LOCK(&m->lock);
    udbtl_get_t *get = m->free_gets;
    if (NULL != get) {
        m->free_gets = get->next_free;
    } else if (NULL != (get = calloc(1, sizeof(*get)))) {
        get->next_all = m->all_gets;
        m->all_gets = get;
    }
    OPAL_THREAD_UNLOCK(&m->lock);
    return get;
}

static void get_release(udbtl_module_t *m, udbtl_get_t *get)
{
    OPAL_THREAD_LOCK(&m->lock);
    get->next_free = m->free_gets;
    m->free_gets = get;
    OPAL_THREAD_UNLOCK(&m->lock);
}

static int udbtl_get(struct mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                     void *local_address, uint64_t remote_address,
                     mca_btl_base_registration_handle_t *local_handle,
                     mca_btl_base_registration_handle_t *remote_handle, size_t size, int flags,
                     int order, mca_btl_base_rdma_completion_fn_t cbfunc, void *cbcontext,
                     void *cbdata)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    (void) flags;
    (void) order;
    if (size > btl->btl_get_limit) {
        return OPAL_ERR_NOT_AVAILABLE;
    }
    if (NULL == remote_handle || 0 == remote_handle->key) {
        /* Not a handle of a REMOTE_READ registration of udbtl's. */
        return OPAL_ERROR;
    }
    if (OPAL_SUCCESS
        == udbtl_local_read(m, local_address, remote_address, size, remote_handle)) {
        /* Done already: ob1 takes the completion inside its call, as
         * vader's single-copy gets give it. */
        cbfunc(btl, endpoint, local_address, local_handle, cbcontext, cbdata, OPAL_SUCCESS);
        return OPAL_SUCCESS;
    }
    udbtl_get_t *get = get_record(m);
    if (NULL == get) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    get->cbfunc = cbfunc;
    get->cbcontext = cbcontext;
    get->cbdata = cbdata;
    get->local_address = local_address;
    get->local_handle = local_handle;
    get->endpoint = endpoint;
    int rc = udbtl_rs_get(m->rs, endpoint->id, local_address, size, remote_address,
                          remote_handle->key, (uint64_t) (uintptr_t) get);
    if (UDBTL_RS_OK == rc) {
        return OPAL_SUCCESS;
    }
    get_release(m, get);
    switch (rc) {
    case UDBTL_RS_BUSY:
        /* ob1 queues the get and retries it from progress. */
        return OPAL_ERR_OUT_OF_RESOURCE;
    case UDBTL_RS_UNREACH:
        return OPAL_ERR_UNREACH;
    default:
        return OPAL_ERROR;
    }
}

/* A get is over. Called by Rust from progress, with no lock held. */
void udbtl_c_got(void *btl, uint64_t context, int status)
{
    udbtl_module_t *m = (udbtl_module_t *) btl;
    udbtl_get_t *get = (udbtl_get_t *) (uintptr_t) context;
    int rc = OPAL_SUCCESS;
    if (UDBTL_GOT_PEER_LOST == status) {
        rc = OPAL_ERR_UNREACH;
        udbtl_report_lost(m, get->endpoint, 1, "a get from it could not be completed");
    } else if (UDBTL_GOT_OK != status) {
        rc = OPAL_ERROR;
    }
    get->cbfunc(&m->super, get->endpoint, get->local_address, get->local_handle, get->cbcontext,
                get->cbdata, rc);
    get_release(m, get);
}

/* ----- the module ------------------------------------------------------- */

void udbtl_rdma_enable(mca_btl_base_module_t *btl, size_t get_limit, unsigned flags)
{
    if (0 == get_limit || 0 == (flags & MCA_BTL_FLAGS_GET)) {
        btl->btl_flags &= ~MCA_BTL_FLAGS_GET;
        btl->btl_get = NULL;
        btl->btl_register_mem = NULL;
        btl->btl_deregister_mem = NULL;
        btl->btl_registration_handle_size = 0;
        return;
    }
    btl->btl_flags |= MCA_BTL_FLAGS_GET;
    btl->btl_get = udbtl_get;
    btl->btl_register_mem = udbtl_register_mem;
    btl->btl_deregister_mem = udbtl_deregister_mem;
    btl->btl_registration_handle_size = sizeof(mca_btl_base_registration_handle_t);
    btl->btl_get_limit = get_limit;
    btl->btl_get_alignment = 0;
    btl->btl_get_local_registration_threshold = 0;
}

void udbtl_module_free_gets(udbtl_module_t *m)
{
    while (NULL != m->all_gets) {
        udbtl_get_t *next = m->all_gets->next_all;
        free(m->all_gets);
        m->all_gets = next;
    }
    m->free_gets = NULL;
}
