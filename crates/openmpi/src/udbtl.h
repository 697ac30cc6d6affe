/*
 * mca_btl_udbtl: what the component's C files share.
 *
 * Open MPI finds a component by its exported struct and drives it through
 * function pointers in structs whose layouts only its headers know, so the
 * C files are the only ones that include them:
 *
 *   component.c  the component: init (interfaces from the job's placement),
 *                progress, module finalize, logging
 *   module.c     descriptors and sends, and ob1's flow control
 *   procs.c      peers: add, delete, adopt on first contact, loss reports
 *   params.c     typed MCA variables and the MPI_T counters
 *   rdma.c       get (ob1's RGET), emulated over the reliable stream
 *   local_read.c get between two processes of one host, in one copy
 *
 * Each forwards to the small `udbtl_rs_*` surface in Rust (src/ffi/),
 * which owns the transport. Rust calls back through the `udbtl_c_*`
 * functions, from progress, holding no lock of its own.
 *
 * Threads: the component serves every MPI thread level. Rust's modules lock
 * themselves; a module's C state (its descriptors, its endpoints and their
 * counts) is guarded by `udbtl_module_t.lock`, which is never held across a
 * call into Rust or Open MPI. One thread at a time delivers a module's
 * events (Rust sees to it), so they reach ob1 in order.
 */
#ifndef UDBTL_H
#define UDBTL_H

#include "opal_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "opal/class/opal_object.h"
#include "opal/datatype/opal_convertor.h"
#include "opal/mca/btl/base/base.h"
#include "opal/mca/btl/btl.h"
#include "opal/threads/mutex.h"
#include "opal/util/proc.h"

/* ----- the Rust surface (src/ffi/) ------------------------------------ */

#define UDBTL_RS_OK 0
#define UDBTL_RS_BUSY (-1)
#define UDBTL_RS_UNREACH (-2)
#define UDBTL_RS_ERROR (-3)

/* Parameter types (crate::params::McaType). */
#define UDBTL_TYPE_TEXT 0
#define UDBTL_TYPE_UNSIGNED 1
#define UDBTL_TYPE_SIZE 2
#define UDBTL_TYPE_BOOL 3
#define UDBTL_TYPE_CHOICE 4

/* What Open MPI learns of a module. */
struct udbtl_rs_limits {
    /* One datagram's payload: the most a packed fragment holds. */
    size_t eager_limit;
    /* The largest alloc (a bounce buffer past one datagram): ob1's eager
     * limit. */
    size_t alloc_limit;
    size_t rndv_eager_limit;
    size_t max_send_size;
    size_t send_frags_max;
    uint32_t exclusivity;
    uint32_t bandwidth;
    int loopback;
    /* Most bytes one get may read; 0: the module cannot get (unreliable). */
    size_t get_limit;
};

/* Who this process is, and where its job runs. */
struct udbtl_rs_identity {
    uint32_t job_id;
    uint32_t vpid;
    uint32_t local_rank;
    int one_host;
};

extern size_t udbtl_rs_param_count(void);
extern int udbtl_rs_param(size_t index, const char **name, const char **default_value,
                          const char **help, int *type, int *level);
extern const char *udbtl_rs_param_choice(size_t index, size_t choice);
extern size_t udbtl_rs_counter_count(void);
extern int udbtl_rs_counter_info(size_t index, char *name, size_t name_len, char *help,
                                 size_t help_len);
extern uint64_t udbtl_rs_counter(void *component, size_t index);
extern void *udbtl_rs_init(const char *const *values, const struct udbtl_rs_identity *who,
                           size_t *modules, char *error, size_t error_len);
extern void *udbtl_rs_module(void *component, size_t index);
extern int udbtl_rs_limits(void *module, struct udbtl_rs_limits *limits);
extern size_t udbtl_rs_modex(void *component, uint8_t *blob, size_t capacity);
extern int udbtl_rs_finalize(void *component, char *error, size_t error_len);
extern int udbtl_rs_add_proc(void *module, const uint8_t *blob, size_t len, uint32_t job_id,
                             uint32_t vpid, int own_job, uint64_t context, uint32_t *endpoint,
                             uint64_t *existing);
extern int udbtl_rs_del_proc(void *module, uint32_t endpoint);
extern int udbtl_rs_progress(void *module, void *btl);
extern int udbtl_rs_drain(void *module);
extern int udbtl_rs_alloc(void *module, uint8_t order, size_t size, uint32_t *des, void **data);
extern int udbtl_rs_prepare_lent(void *module, uint8_t order, size_t reserve, const void *data,
                                 size_t len, uint32_t *des, void **header);
extern int udbtl_rs_free(void *module, uint32_t des);
extern int udbtl_rs_send(void *module, uint32_t endpoint, uint32_t des, size_t len, uint8_t tag,
                         int owned, uint64_t context);
extern int udbtl_rs_register(void *module, const void *base, size_t len, uint64_t *key);
extern int udbtl_rs_deregister(void *module, uint64_t key);
extern int udbtl_rs_get(void *module, uint32_t endpoint, void *local, size_t len,
                        uint64_t remote_addr, uint64_t remote_key, uint64_t context);
extern uint64_t udbtl_rs_memory_domain(void);
extern size_t udbtl_rs_dump(void *module, char *text, size_t capacity);
extern size_t udbtl_rs_stats_line(void *module, char *text, size_t capacity);

/* udbtl_c_got statuses (src/ffi/rdma.rs). */
#define UDBTL_GOT_OK 0
#define UDBTL_GOT_REFUSED 1
#define UDBTL_GOT_PEER_LOST 2

/* ----- types ------------------------------------------------------------ */

/* What ob1 passes to a peer to let it read a registered buffer: the key of
 * the Rust region (0 for a registration of local memory only), and, for a
 * reader on the same host, the owner's host identity (0: none) and PID
 * (local_read.c). */
struct mca_btl_base_registration_handle_t {
    uint64_t key;
    uint64_t host;
    int32_t pid;
    uint32_t reserved;
};

typedef struct udbtl_module udbtl_module_t;

/* A peer as ob1 holds it (opaque to ob1, which only hands it back). Kept
 * until its module is finalized, even after del_procs: sends to it may
 * still complete, or fail, and name it. */
struct mca_btl_base_endpoint_t {
    opal_proc_t *proc;
    udbtl_module_t *module;
    uint32_t id;
    /* Its loss was reported to ob1 (once is enough: it aborts). */
    bool lost;
    /* Deleted by ob1: nothing more is reported about it. */
    bool deleted;
    /* Sends to it handed to Rust and not completed (under the module's
     * lock): from the component's `lend_after` on, it is a stream, and
     * prepare_src lends eager messages longer than a datagram instead of
     * copying them (module.c). */
    size_t outstanding;
    struct mca_btl_base_endpoint_t *next_all;
};
typedef struct mca_btl_base_endpoint_t udbtl_endpoint_t;

struct udbtl_module {
    mca_btl_base_module_t super;
    void *rs;
    mca_btl_base_module_error_cb_fn_t error_cb;
    /* Guards everything below. */
    opal_mutex_t lock;
    /* Descriptors not in use, and every one ever made (freed at finalize). */
    struct udbtl_frag *free_frags;
    struct udbtl_frag *all_frags;
    /* This job's endpoints by vpid (the live one), and every endpoint. */
    udbtl_endpoint_t **by_vpid;
    size_t by_vpid_len;
    udbtl_endpoint_t *all_endpoints;
    /* ob1's flow control (module.c): send fragments taken from Rust and not
     * back; sends handed to Rust and not completed; the bound of Rust's
     * fragment list; below `silent_max` outstanding sends, an owned send
     * completes at once (returns 1, no callback); from `throttle_at` on,
     * prepare_src refuses, so ob1 queues. */
    size_t frags_in_use;
    size_t outstanding;
    /* One datagram's payload (ob1's eager limit may be larger: such an
     * alloc is a bounce buffer sent as a train). */
    size_t datagram;
    size_t send_frags_max;
    size_t silent_max;
    size_t throttle_at;
    /* Get records not in use, and every one ever made (rdma.c). */
    struct udbtl_get *free_gets;
    struct udbtl_get *all_gets;
    /* Gets read from a process of this host in one copy (local_read.c), and
     * whether the kernel refused such a read once (then none is tried
     * again). Atomic, outside the lock. */
    uint64_t gets_local;
    bool local_read_refused;
    /* Eager messages sent from the user's buffer in a stream (module.c).
     * Atomic, outside the lock. */
    uint64_t eager_lent;
};

/* An Open MPI descriptor around a Rust send fragment: one segment, or, when
 * it sends from the user's buffer, the header and then the data. */
typedef struct udbtl_frag {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segments[2];
    udbtl_module_t *module;
    udbtl_endpoint_t *endpoint;
    uint32_t des;
    /* A send fragment (counted in frags_in_use), not a user one. */
    bool counted;
    /* send returned 1: ob1 has already counted it complete, so its
     * completion only frees it. */
    bool silent;
    struct udbtl_frag *next_free;
    struct udbtl_frag *next_all;
} udbtl_frag_t;

typedef struct udbtl_component {
    mca_btl_base_component_3_0_0_t super;
    void *rs;
    size_t num_modules;
    udbtl_module_t **modules;
    /* Processes in this process's job, 0 when Open MPI did not say. */
    uint32_t job_size;
    /* Component variables (params.c). */
    bool print_stats;
    unsigned latency;
    size_t eager_limit;
    unsigned flags;
    /* With inplace: sends to one peer outstanding from which an eager
     * message longer than a datagram is lent, not copied (module.c). */
    unsigned lend_after;
    /* Gets between processes of one host read in one copy (local_read.c). */
    bool single_copy;
    /* This host's identity for such reads (udbtl_rs_memory_domain), 0 when off,
     * and this process's PID (looked up once: getpid is a system call). */
    uint64_t local_host;
    int32_t local_pid;
} udbtl_component_t;

OPAL_MODULE_DECLSPEC extern udbtl_component_t mca_btl_udbtl_component;

/* ----- between the files ------------------------------------------------ */

/* params.c */
int udbtl_params_register(udbtl_component_t *c);
char **udbtl_params_explicit(void);
void udbtl_params_free_explicit(char **values);

/* module.c */
extern const mca_btl_base_module_t udbtl_module_template;
void udbtl_module_apply_limits(udbtl_module_t *m);
void udbtl_module_free_frags(udbtl_module_t *m);

/* rdma.c */
void udbtl_rdma_enable(mca_btl_base_module_t *btl, size_t get_limit, unsigned flags);
void udbtl_module_free_gets(udbtl_module_t *m);

/* local_read.c */
void udbtl_local_stamp(mca_btl_base_registration_handle_t *handle);
int udbtl_local_read(udbtl_module_t *m, void *local, uint64_t remote, size_t size,
                     const mca_btl_base_registration_handle_t *handle);

/* procs.c */
int udbtl_add_procs(struct mca_btl_base_module_t *btl, size_t nprocs, struct opal_proc_t **procs,
                    struct mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable);
int udbtl_del_procs(struct mca_btl_base_module_t *btl, size_t nprocs, struct opal_proc_t **procs,
                    struct mca_btl_base_endpoint_t **peers);
void udbtl_report_lost(udbtl_module_t *m, udbtl_endpoint_t *ep, int fatal, const char *message);
void udbtl_module_free_endpoints(udbtl_module_t *m);

/* component.c */
int udbtl_finalize(struct mca_btl_base_module_t *btl);

#endif
