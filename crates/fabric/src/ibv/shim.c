/*
 * A thin C shim over libibverbs for the udbtl `verbs` provider.
 *
 * libibverbs' hot calls (ibv_post_send, ibv_post_recv, ibv_poll_cq, and
 * ibv_query_port's compatibility wrapper) are `static inline` functions in
 * <infiniband/verbs.h> that dispatch through the provider's ops table, so
 * no extern declaration can reach them. This file exposes them, and the rest
 * of what the provider needs, as plain functions whose arguments are
 * pointers, integers and small structs that the Rust side declares with
 * #[repr(C)] (crates/fabric/src/ibv/sys.rs). Keep the two in sync.
 *
 * Conventions: functions returning an object return NULL and leave errno
 * set on failure; functions returning int return 0 or a positive errno.
 * Every integer crosses in host byte order: the shim converts the fields
 * verbs keeps in network order (pkeys, immediate data, GUIDs).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>

/* The enum values the Rust side (ibv/logic.rs, ibv/provider.rs) relies on. */
_Static_assert(IBV_MTU_256 == 1 && IBV_MTU_4096 == 5, "ibv_mtu");
_Static_assert(IBV_PORT_ACTIVE == 4, "ibv_port_state");
_Static_assert(IBV_LINK_LAYER_INFINIBAND == 1 && IBV_LINK_LAYER_ETHERNET == 2, "link layer");
_Static_assert(IBV_WC_SUCCESS == 0 && IBV_WC_LOC_LEN_ERR == 1 && IBV_WC_LOC_PROT_ERR == 4 &&
                   IBV_WC_WR_FLUSH_ERR == 5,
               "ibv_wc_status");
_Static_assert(IBV_WC_RECV == 128 && IBV_WC_GRH == 1 && IBV_WC_WITH_IMM == 2, "ibv_wc");
_Static_assert(IBV_EVENT_CQ_ERR == 0 && IBV_EVENT_QP_FATAL == 1 && IBV_EVENT_DEVICE_FATAL == 8 &&
                   IBV_EVENT_PORT_ACTIVE == 9 && IBV_EVENT_PORT_ERR == 10,
               "ibv_event_type");

/* Most work requests one shim call hands to the device at once. */
#define UDBTL_BATCH 32

struct udbtl_dev_attr {
    uint32_t max_qp;
    uint32_t max_qp_wr;
    uint32_t max_sge;
    uint32_t max_cq;
    uint32_t max_cqe;
    uint32_t max_mr;
    uint32_t max_ah;
    uint32_t phys_port_cnt;
    uint64_t node_guid;
};

struct udbtl_port_attr {
    uint32_t state;
    uint32_t max_mtu;
    uint32_t active_mtu;
    uint32_t max_msg_sz;
    int32_t gid_tbl_len;
    uint16_t pkey_tbl_len;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t lmc;
    uint8_t link_layer;
};

struct udbtl_qp_cap {
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
};

struct udbtl_ah_attr {
    uint8_t dgid[16];
    uint32_t flow_label;
    uint16_t dlid;
    uint8_t sl;
    uint8_t src_path_bits;
    uint8_t port_num;
    uint8_t is_global;
    uint8_t sgid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
};

/* flags: bit 0 signaled, bit 1 inline, bit 2 solicited, bit 3 immediate */
struct udbtl_send {
    uint64_t wr_id;
    uint64_t addr;
    struct ibv_ah *ah;
    uint32_t length;
    uint32_t lkey;
    uint32_t remote_qpn;
    uint32_t remote_qkey;
    uint32_t imm;
    uint32_t flags;
};

struct udbtl_recv {
    uint64_t wr_id;
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

struct udbtl_wc {
    uint64_t wr_id;
    uint32_t status;
    uint32_t opcode;
    uint32_t vendor_err;
    uint32_t byte_len;
    uint32_t imm_data;
    uint32_t qp_num;
    uint32_t src_qp;
    uint32_t wc_flags;
    uint16_t slid;
    uint8_t sl;
    uint8_t dlid_path_bits;
};

struct ibv_device **udbtl_get_device_list(int *count) { return ibv_get_device_list(count); }

void udbtl_free_device_list(struct ibv_device **list) { ibv_free_device_list(list); }

const char *udbtl_device_name(struct ibv_device *dev) { return ibv_get_device_name(dev); }

const char *udbtl_event_type_str(uint32_t event) {
    return ibv_event_type_str((enum ibv_event_type)event);
}

struct ibv_context *udbtl_open_device(struct ibv_device *dev) {
    struct ibv_context *ctx = ibv_open_device(dev);
    if (ctx == NULL) {
        return NULL;
    }
    /* Async events are read by polling, never by blocking. */
    int flags = fcntl(ctx->async_fd, F_GETFL);
    if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        int err = errno;
        ibv_close_device(ctx);
        errno = err;
        return NULL;
    }
    return ctx;
}

int udbtl_close_device(struct ibv_context *ctx) { return ibv_close_device(ctx) ? errno : 0; }

int udbtl_query_device(struct ibv_context *ctx, struct udbtl_dev_attr *out) {
    struct ibv_device_attr attr;
    memset(&attr, 0, sizeof attr);
    int rc = ibv_query_device(ctx, &attr);
    if (rc) {
        return rc;
    }
    out->max_qp = (uint32_t)attr.max_qp;
    out->max_qp_wr = (uint32_t)attr.max_qp_wr;
    out->max_sge = (uint32_t)attr.max_sge;
    out->max_cq = (uint32_t)attr.max_cq;
    out->max_cqe = (uint32_t)attr.max_cqe;
    out->max_mr = (uint32_t)attr.max_mr;
    out->max_ah = (uint32_t)attr.max_ah;
    out->phys_port_cnt = attr.phys_port_cnt;
    out->node_guid = be64toh(attr.node_guid);
    return 0;
}

int udbtl_query_port(struct ibv_context *ctx, uint8_t port, struct udbtl_port_attr *out) {
    struct ibv_port_attr attr;
    memset(&attr, 0, sizeof attr);
    int rc = ibv_query_port(ctx, port, &attr);
    if (rc) {
        return rc;
    }
    out->state = attr.state;
    out->max_mtu = attr.max_mtu;
    out->active_mtu = attr.active_mtu;
    out->max_msg_sz = attr.max_msg_sz;
    out->gid_tbl_len = attr.gid_tbl_len;
    out->pkey_tbl_len = attr.pkey_tbl_len;
    out->lid = attr.lid;
    out->sm_lid = attr.sm_lid;
    out->lmc = attr.lmc;
    out->link_layer = attr.link_layer;
    return 0;
}

int udbtl_query_gid(struct ibv_context *ctx, uint8_t port, int index, uint8_t out[16]) {
    union ibv_gid gid;
    if (ibv_query_gid(ctx, port, index, &gid)) {
        return errno ? errno : EINVAL;
    }
    memcpy(out, gid.raw, 16);
    return 0;
}

int udbtl_query_pkey(struct ibv_context *ctx, uint8_t port, int index, uint16_t *out) {
    __be16 pkey;
    if (ibv_query_pkey(ctx, port, index, &pkey)) {
        return errno ? errno : EINVAL;
    }
    *out = ntohs(pkey);
    return 0;
}

struct ibv_pd *udbtl_alloc_pd(struct ibv_context *ctx) { return ibv_alloc_pd(ctx); }

int udbtl_dealloc_pd(struct ibv_pd *pd) { return ibv_dealloc_pd(pd); }

/* UD needs no remote access: local write only. */
struct ibv_mr *udbtl_reg_mr(struct ibv_pd *pd, void *addr, size_t len) {
    return ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE);
}

uint32_t udbtl_mr_lkey(const struct ibv_mr *mr) { return mr->lkey; }

int udbtl_dereg_mr(struct ibv_mr *mr) { return ibv_dereg_mr(mr); }

struct ibv_cq *udbtl_create_cq(struct ibv_context *ctx, int cqe) {
    return ibv_create_cq(ctx, cqe, NULL, NULL, 0);
}

int udbtl_cq_capacity(const struct ibv_cq *cq) { return cq->cqe; }

int udbtl_resize_cq(struct ibv_cq *cq, int cqe) { return ibv_resize_cq(cq, cqe); }

int udbtl_destroy_cq(struct ibv_cq *cq) { return ibv_destroy_cq(cq); }

/* A UD queue pair; `cap` is the request on entry and the grant on return. */
struct ibv_qp *udbtl_create_ud_qp(struct ibv_pd *pd, struct ibv_cq *send_cq,
                                  struct ibv_cq *recv_cq, struct udbtl_qp_cap *cap) {
    struct ibv_qp_init_attr init;
    memset(&init, 0, sizeof init);
    init.send_cq = send_cq;
    init.recv_cq = recv_cq;
    init.qp_type = IBV_QPT_UD;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = cap->max_send_wr;
    init.cap.max_recv_wr = cap->max_recv_wr;
    init.cap.max_send_sge = cap->max_send_sge;
    init.cap.max_recv_sge = cap->max_recv_sge;
    init.cap.max_inline_data = cap->max_inline_data;
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    if (qp != NULL) {
        cap->max_send_wr = init.cap.max_send_wr;
        cap->max_recv_wr = init.cap.max_recv_wr;
        cap->max_send_sge = init.cap.max_send_sge;
        cap->max_recv_sge = init.cap.max_recv_sge;
        cap->max_inline_data = init.cap.max_inline_data;
    }
    return qp;
}

uint32_t udbtl_qp_num(const struct ibv_qp *qp) { return qp->qp_num; }

int udbtl_modify_qp_init(struct ibv_qp *qp, uint16_t pkey_index, uint8_t port, uint32_t qkey) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = pkey_index;
    attr.port_num = port;
    attr.qkey = qkey;
    return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
}

int udbtl_modify_qp_rtr(struct ibv_qp *qp) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.qp_state = IBV_QPS_RTR;
    return ibv_modify_qp(qp, &attr, IBV_QP_STATE);
}

int udbtl_modify_qp_rts(struct ibv_qp *qp, uint32_t sq_psn) {
    struct ibv_qp_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = sq_psn & 0xffffff;
    return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

int udbtl_destroy_qp(struct ibv_qp *qp) { return ibv_destroy_qp(qp); }

struct ibv_ah *udbtl_create_ah(struct ibv_pd *pd, const struct udbtl_ah_attr *in) {
    struct ibv_ah_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.dlid = in->dlid;
    attr.sl = in->sl;
    attr.src_path_bits = in->src_path_bits;
    attr.port_num = in->port_num;
    attr.is_global = in->is_global;
    if (in->is_global) {
        memcpy(attr.grh.dgid.raw, in->dgid, 16);
        attr.grh.flow_label = in->flow_label;
        attr.grh.sgid_index = in->sgid_index;
        attr.grh.hop_limit = in->hop_limit;
        attr.grh.traffic_class = in->traffic_class;
    }
    return ibv_create_ah(pd, &attr);
}

int udbtl_destroy_ah(struct ibv_ah *ah) { return ibv_destroy_ah(ah); }

/*
 * Posts `count` sends as linked lists of at most UDBTL_BATCH requests, one
 * gather entry each. `*posted` is set to how many the device accepted.
 */
int udbtl_post_send(struct ibv_qp *qp, const struct udbtl_send *list, int count, int *posted) {
    struct ibv_send_wr wrs[UDBTL_BATCH];
    struct ibv_sge sges[UDBTL_BATCH];
    *posted = 0;
    while (*posted < count) {
        int n = count - *posted;
        if (n > UDBTL_BATCH) {
            n = UDBTL_BATCH;
        }
        memset(wrs, 0, sizeof(wrs[0]) * (size_t)n);
        for (int i = 0; i < n; i++) {
            const struct udbtl_send *s = &list[*posted + i];
            sges[i].addr = s->addr;
            sges[i].length = s->length;
            sges[i].lkey = s->lkey;
            wrs[i].wr_id = s->wr_id;
            wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
            wrs[i].sg_list = &sges[i];
            wrs[i].num_sge = s->length > 0 ? 1 : 0;
            wrs[i].opcode = (s->flags & 8) ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
            wrs[i].send_flags = ((s->flags & 1) ? IBV_SEND_SIGNALED : 0) |
                                ((s->flags & 2) ? IBV_SEND_INLINE : 0) |
                                ((s->flags & 4) ? IBV_SEND_SOLICITED : 0);
            if (s->flags & 8) {
                wrs[i].imm_data = htonl(s->imm);
            }
            wrs[i].wr.ud.ah = s->ah;
            wrs[i].wr.ud.remote_qpn = s->remote_qpn;
            wrs[i].wr.ud.remote_qkey = s->remote_qkey;
        }
        struct ibv_send_wr *bad = NULL;
        int rc = ibv_post_send(qp, wrs, &bad);
        if (rc) {
            *posted += bad != NULL ? (int)(bad - wrs) : 0;
            return rc;
        }
        *posted += n;
    }
    return 0;
}

/* Posts `count` receives, one scatter entry each; as udbtl_post_send. */
int udbtl_post_recv(struct ibv_qp *qp, const struct udbtl_recv *list, int count, int *posted) {
    struct ibv_recv_wr wrs[UDBTL_BATCH];
    struct ibv_sge sges[UDBTL_BATCH];
    *posted = 0;
    while (*posted < count) {
        int n = count - *posted;
        if (n > UDBTL_BATCH) {
            n = UDBTL_BATCH;
        }
        for (int i = 0; i < n; i++) {
            const struct udbtl_recv *r = &list[*posted + i];
            sges[i].addr = r->addr;
            sges[i].length = r->length;
            sges[i].lkey = r->lkey;
            wrs[i].wr_id = r->wr_id;
            wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
            wrs[i].sg_list = &sges[i];
            wrs[i].num_sge = 1;
        }
        struct ibv_recv_wr *bad = NULL;
        int rc = ibv_post_recv(qp, wrs, &bad);
        if (rc) {
            *posted += bad != NULL ? (int)(bad - wrs) : 0;
            return rc;
        }
        *posted += n;
    }
    return 0;
}

/* Polls up to `count` completions; returns how many, or -1 on failure. */
int udbtl_poll_cq(struct ibv_cq *cq, int count, struct udbtl_wc *out) {
    struct ibv_wc wcs[UDBTL_BATCH];
    int total = 0;
    while (total < count) {
        int want = count - total;
        if (want > UDBTL_BATCH) {
            want = UDBTL_BATCH;
        }
        int got = ibv_poll_cq(cq, want, wcs);
        if (got < 0) {
            return total > 0 ? total : -1;
        }
        for (int i = 0; i < got; i++) {
            struct udbtl_wc *o = &out[total + i];
            o->wr_id = wcs[i].wr_id;
            o->status = wcs[i].status;
            o->opcode = wcs[i].opcode;
            o->vendor_err = wcs[i].vendor_err;
            o->byte_len = wcs[i].byte_len;
            o->imm_data = (wcs[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wcs[i].imm_data) : 0;
            o->qp_num = wcs[i].qp_num;
            o->src_qp = wcs[i].src_qp;
            o->wc_flags = wcs[i].wc_flags;
            o->slid = wcs[i].slid;
            o->sl = wcs[i].sl;
            o->dlid_path_bits = wcs[i].dlid_path_bits;
        }
        total += got;
        if (got < want) {
            break;
        }
    }
    return total;
}

/*
 * Reads one async event without blocking and acknowledges it. Returns 0 with
 * the event's type and port (0 when it is not a port event), EAGAIN when
 * none is pending, or another errno.
 */
int udbtl_get_async_event(struct ibv_context *ctx, uint32_t *event_type, uint32_t *port) {
    struct ibv_async_event event;
    if (ibv_get_async_event(ctx, &event)) {
        int err = errno;
        return err == EWOULDBLOCK ? EAGAIN : (err ? err : EIO);
    }
    *event_type = event.event_type;
    switch (event.event_type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
        *port = (uint32_t)event.element.port_num;
        break;
    default:
        *port = 0;
        break;
    }
    ibv_ack_async_event(&event);
    return 0;
}
