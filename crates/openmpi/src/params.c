/*
 * mca_btl_udbtl: udbtl's parameters as typed MCA variables, the standard
 * BTL variables, and the counters as MPI_T performance variables.
 *
 * Each udbtl parameter is registered with its own type (integer, size,
 * boolean, a choice as an enumerator, or text) and the level ompi_info
 * shows it at; the values Open MPI was given (command line, environment,
 * files) are handed to Rust as text, which checks them as it checks its
 * UDBTL_* environment. The rest keep udbtl's defaults or that environment.
 * A module's limits (from Rust) and these variables meet here too, in what
 * the module tells ob1 (udbtl_module_apply_limits).
 */

#include "udbtl.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opal/mca/base/mca_base_pvar.h"
#include "opal/mca/base/mca_base_var.h"
#include "opal/mca/base/mca_base_var_enum.h"

#define UDBTL_MAX_PARAMS 64
#define UDBTL_MAX_CHOICES 16

/* A parameter's storage and how to read it back. The variable system keeps
 * pointers to the storage until the component is unloaded, after close,
 * so it is static. */
struct param {
    int index;
    int type;
    union {
        char *text;
        unsigned u;
        size_t size;
        bool flag;
        int choice;
    } value;
};
static struct param params[UDBTL_MAX_PARAMS];
static size_t num_params;

static const mca_base_var_info_lvl_t levels[] = {
    OPAL_INFO_LVL_1, OPAL_INFO_LVL_2, OPAL_INFO_LVL_3, OPAL_INFO_LVL_4, OPAL_INFO_LVL_5,
    OPAL_INFO_LVL_6, OPAL_INFO_LVL_7, OPAL_INFO_LVL_8, OPAL_INFO_LVL_9,
};

static mca_base_var_info_lvl_t level_of(int level)
{
    return level >= 1 && level <= 9 ? levels[level - 1] : OPAL_INFO_LVL_9;
}

/* A default as Rust renders it: decimal, 0x hex, or with a k/m/g (binary)
 * suffix. */
static uint64_t parse_number(const char *text)
{
    char *end = NULL;
    uint64_t n = strtoull(text, &end, 0);
    switch (NULL != end ? *end : '\0') {
    case 'k': case 'K': return n << 10;
    case 'm': case 'M': return n << 20;
    case 'g': case 'G': return n << 30;
    default: return n;
    }
}

/* An enumerator of parameter `i`'s choices, or NULL. */
static mca_base_var_enum_t *choices_of(size_t i, const char *name, const char *def, int *chosen)
{
    static mca_base_var_enum_value_t values[UDBTL_MAX_CHOICES + 1];
    size_t n = 0;
    const char *choice;
    *chosen = 0;
    while (n < UDBTL_MAX_CHOICES && NULL != (choice = udbtl_rs_param_choice(i, n))) {
        values[n].value = (int) n;
        values[n].string = choice;
        if (NULL != def && 0 == strcmp(def, choice)) {
            *chosen = (int) n;
        }
        ++n;
    }
    values[n].value = 0;
    values[n].string = NULL;
    char enum_name[128];
    snprintf(enum_name, sizeof(enum_name), "btl_udbtl_%s", name);
    mca_base_var_enum_t *e = NULL;
    return OPAL_SUCCESS == mca_base_var_enum_create(enum_name, values, &e) ? e : NULL;
}

static int register_param(udbtl_component_t *c, size_t i)
{
    const char *name, *def, *help;
    int type, level;
    if (UDBTL_RS_OK != udbtl_rs_param(i, &name, &def, &help, &type, &level)) {
        return OPAL_ERROR;
    }
    struct param *p = &params[i];
    mca_base_var_type_t var_type;
    mca_base_var_enum_t *e = NULL;
    void *storage = &p->value;
    p->type = type;
    switch (type) {
    case UDBTL_TYPE_UNSIGNED:
        var_type = MCA_BASE_VAR_TYPE_UNSIGNED_INT;
        p->value.u = NULL != def ? (unsigned) parse_number(def) : 0;
        storage = &p->value.u;
        break;
    case UDBTL_TYPE_SIZE:
        var_type = MCA_BASE_VAR_TYPE_SIZE_T;
        p->value.size = NULL != def ? (size_t) parse_number(def) : 0;
        storage = &p->value.size;
        break;
    case UDBTL_TYPE_BOOL:
        var_type = MCA_BASE_VAR_TYPE_BOOL;
        p->value.flag = NULL != def && 0 == strcmp(def, "true");
        storage = &p->value.flag;
        break;
    case UDBTL_TYPE_CHOICE:
        var_type = MCA_BASE_VAR_TYPE_INT;
        e = choices_of(i, name, def, &p->value.choice);
        storage = &p->value.choice;
        if (NULL == e) {
            return OPAL_ERROR;
        }
        break;
    default:
        var_type = MCA_BASE_VAR_TYPE_STRING;
        p->value.text = NULL != def ? strdup(def) : NULL;
        storage = &p->value.text;
        break;
    }
    p->index = mca_base_component_var_register(
        &c->super.btl_version, name, help, var_type, e, 0,
        NULL == def ? MCA_BASE_VAR_FLAG_DEF_UNSET : 0, level_of(level),
        MCA_BASE_VAR_SCOPE_READONLY, storage);
    if (NULL != e) {
        OBJ_RELEASE(e);
    }
    return OPAL_SUCCESS;
}

/* Reads counter `pvar->ctx` of the running transport (0 before it runs). */
static int read_counter(const struct mca_base_pvar_t *pvar, void *value, void *obj)
{
    (void) obj;
    *(unsigned long long *) value = (unsigned long long) udbtl_rs_counter(
        mca_btl_udbtl_component.rs, (size_t) (uintptr_t) pvar->ctx);
    return OPAL_SUCCESS;
}

static void register_counters(udbtl_component_t *c)
{
    size_t count = udbtl_rs_counter_count();
    for (size_t i = 0; i < count; ++i) {
        char name[64], help[256];
        if (UDBTL_RS_OK != udbtl_rs_counter_info(i, name, sizeof(name), help, sizeof(help))) {
            continue;
        }
        (void) mca_base_component_pvar_register(
            &c->super.btl_version, name, help, OPAL_INFO_LVL_4, MCA_BASE_PVAR_CLASS_COUNTER,
            MCA_BASE_VAR_TYPE_UNSIGNED_LONG_LONG, NULL, MCA_BASE_VAR_BIND_NO_OBJECT,
            MCA_BASE_PVAR_FLAG_READONLY | MCA_BASE_PVAR_FLAG_CONTINUOUS, read_counter, NULL, NULL,
            (void *) (uintptr_t) i);
    }
}

/* Counters kept in C by each module (atomic, relaxed), by their offset in
 * udbtl_module_t; read as MPI_T performance variables summed over the
 * modules (0 before any exists). */
static const struct {
    const char *name;
    const char *help;
    size_t offset;
} module_counters[] = {
    {"gets_local", "Gets read from a process of this host in one copy (see single_copy)",
     offsetof(udbtl_module_t, gets_local)},
    {"eager_lent", "Eager messages sent from the user's buffer in a stream (see lend_after)",
     offsetof(udbtl_module_t, eager_lent)},
};

static int read_module_counter(const struct mca_base_pvar_t *pvar, void *value, void *obj)
{
    (void) obj;
    const udbtl_component_t *c = &mca_btl_udbtl_component;
    size_t offset = (size_t) (uintptr_t) pvar->ctx;
    unsigned long long total = 0;
    for (size_t i = 0; i < c->num_modules; ++i) {
        const uint64_t *counter = (const uint64_t *) ((const char *) c->modules[i] + offset);
        total += __atomic_load_n(counter, __ATOMIC_RELAXED);
    }
    *(unsigned long long *) value = total;
    return OPAL_SUCCESS;
}

static void register_module_counters(udbtl_component_t *c)
{
    for (size_t i = 0; i < sizeof(module_counters) / sizeof(module_counters[0]); ++i) {
        (void) mca_base_component_pvar_register(
            &c->super.btl_version, module_counters[i].name, module_counters[i].help,
            OPAL_INFO_LVL_4, MCA_BASE_PVAR_CLASS_COUNTER, MCA_BASE_VAR_TYPE_UNSIGNED_LONG_LONG,
            NULL, MCA_BASE_VAR_BIND_NO_OBJECT,
            MCA_BASE_PVAR_FLAG_READONLY | MCA_BASE_PVAR_FLAG_CONTINUOUS, read_module_counter,
            NULL, NULL, (void *) (uintptr_t) module_counters[i].offset);
    }
}

/* The component's own variables, and the standard BTL names udbtl's
 * parameters do not already carry. */
static void register_component_vars(udbtl_component_t *c)
{
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
    c->eager_limit = 0;
    (void) mca_base_component_var_register(
        &c->super.btl_version, "eager_limit",
        "Maximum size (in bytes, including ob1's header) of messages sent eagerly; 0: "
        "udbtl's eager_max on a reliable module (66 KiB; a message longer than one datagram "
        "goes as a train of datagrams), or the largest payload of one datagram of the "
        "module's interface (about 64 KiB on loopback, 1.4 KB at MTU 1500); either is also "
        "the most it may be",
        MCA_BASE_VAR_TYPE_SIZE_T, NULL, 0, 0, OPAL_INFO_LVL_4, MCA_BASE_VAR_SCOPE_READONLY,
        &c->eager_limit);
    c->single_copy = true;
    (void) mca_base_component_var_register(
        &c->super.btl_version, "single_copy",
        "Between two processes of one host (one host name, kernel boot, PID and network "
        "namespace), a get reads the sender's memory straight into the receive buffer with "
        "process_vm_readv (one copy instead of three); where the kernel refuses it (another "
        "user, Yama's ptrace_scope, a non-dumpable process), gets go over the network",
        MCA_BASE_VAR_TYPE_BOOL, NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_LOCAL,
        &c->single_copy);
    c->flags = MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_GET | MCA_BTL_FLAGS_SEND_INPLACE;
    (void) mca_base_component_var_register(
        &c->super.btl_version, "flags",
        "BTL bit flags; udbtl supports send, get on a reliable module (ob1 then reads "
        "large contiguous messages with its RGET protocol, from the sender's memory straight "
        "into the receiver's), and inplace (ob1 hands eager messages to prepare_src, which "
        "sends contiguous ones longer than a datagram from the user's buffer in a stream, "
        "see lend_after, and copies the rest; without it ob1 copies every eager message); "
        "flags it lacks are ignored, and without get ob1 sends large messages in "
        "max_send_size fragments",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, &mca_btl_base_flag_enum->super, 0, 0, OPAL_INFO_LVL_5,
        MCA_BASE_VAR_SCOPE_READONLY, &c->flags);
    c->lend_after = 8;
    (void) mca_base_component_var_register(
        &c->super.btl_version, "lend_after",
        "With inplace in flags: from this many sends to one peer outstanding (a stream, "
        "acknowledged within a round trip), an eager message longer than a datagram is sent "
        "from the user's buffer and completes at its acknowledgement; below it, it is copied "
        "and completes at once (a lone message would wait for its acknowledgement, a "
        "scheduler time slice where ranks share CPUs); 0 lends every such message",
        MCA_BASE_VAR_TYPE_UNSIGNED_INT, NULL, 0, 0, OPAL_INFO_LVL_5, MCA_BASE_VAR_SCOPE_LOCAL,
        &c->lend_after);
}

int udbtl_params_register(udbtl_component_t *c)
{
    num_params = udbtl_rs_param_count();
    if (num_params > UDBTL_MAX_PARAMS) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    for (size_t i = 0; i < num_params; ++i) {
        int rc = register_param(c, i);
        if (OPAL_SUCCESS != rc) {
            return rc;
        }
        const char *name, *def, *help;
        int type, level;
        /* The seed's min_send_size is what Open MPI calls rndv_eager_limit. */
        if (UDBTL_RS_OK == udbtl_rs_param(i, &name, &def, &help, &type, &level)
            && 0 == strcmp(name, "min_send_size") && params[i].index >= 0) {
            (void) mca_base_var_register_synonym(params[i].index, "opal", "btl", "udbtl",
                                                 "rndv_eager_limit", 0);
        }
    }
    register_component_vars(c);
    register_counters(c);
    register_module_counters(c);
    return OPAL_SUCCESS;
}

/* Parameter `i`'s value as udbtl writes it; NULL when out of memory. */
static char *render(size_t i)
{
    const struct param *p = &params[i];
    char text[64];
    switch (p->type) {
    case UDBTL_TYPE_UNSIGNED:
        snprintf(text, sizeof(text), "%u", p->value.u);
        return strdup(text);
    case UDBTL_TYPE_SIZE:
        snprintf(text, sizeof(text), "%zu", p->value.size);
        return strdup(text);
    case UDBTL_TYPE_BOOL:
        return strdup(p->value.flag ? "true" : "false");
    case UDBTL_TYPE_CHOICE: {
        const char *choice = udbtl_rs_param_choice(i, (size_t) p->value.choice);
        return strdup(NULL != choice ? choice : "");
    }
    default:
        return strdup(NULL != p->value.text ? p->value.text : "");
    }
}

/* The text the user gave parameter `i` on mpirun's command line or in the
 * environment (both reach a process as OMPI_MCA_btl_udbtl_<name>), so that
 * udbtl checks what was written ("many" for a number), not what Open MPI's
 * typed parse made of it; NULL when the value came from elsewhere. */
static char *written(size_t i)
{
    const char *name, *def, *help;
    int type, level;
    if (UDBTL_RS_OK != udbtl_rs_param(i, &name, &def, &help, &type, &level)) {
        return NULL;
    }
    char variable[128];
    snprintf(variable, sizeof(variable), "OMPI_MCA_btl_udbtl_%s", name);
    const char *text = getenv(variable);
    return NULL != text ? strdup(text) : NULL;
}

/* The values set through Open MPI, one per parameter (NULL where Open MPI
 * was given none), for udbtl_rs_init; free with
 * udbtl_params_free_explicit. NULL when out of memory. */
char **udbtl_params_explicit(void)
{
    char **values = calloc(num_params + 1, sizeof(char *));
    if (NULL == values) {
        return NULL;
    }
    for (size_t i = 0; i < num_params; ++i) {
        mca_base_var_source_t source = MCA_BASE_VAR_SOURCE_DEFAULT;
        if (params[i].index >= 0
            && OPAL_SUCCESS == mca_base_var_get_value(params[i].index, NULL, &source, NULL)
            && MCA_BASE_VAR_SOURCE_DEFAULT != source) {
            values[i] = written(i);
            if (NULL == values[i]) {
                values[i] = render(i);
            }
            if (NULL == values[i]) {
                udbtl_params_free_explicit(values);
                return NULL;
            }
        }
    }
    return values;
}

void udbtl_params_free_explicit(char **values)
{
    if (NULL == values) {
        return;
    }
    for (size_t i = 0; i < num_params; ++i) {
        free(values[i]);
    }
    free(values);
}

/* ----- applied to a module --------------------------------------------- */

/* Takes the module's limits from Rust (they shrink when a peer with smaller
 * datagrams is added) and the component's variables. */
void udbtl_module_apply_limits(udbtl_module_t *m)
{
    udbtl_component_t *c = &mca_btl_udbtl_component;
    struct udbtl_rs_limits limits;
    if (UDBTL_RS_OK != udbtl_rs_limits(m->rs, &limits)) {
        return;
    }
    size_t eager = limits.alloc_limit;
    if (c->eager_limit > 0 && c->eager_limit < eager) {
        eager = c->eager_limit;
    }
    m->super.btl_eager_limit = eager;
    m->super.btl_rndv_eager_limit = limits.rndv_eager_limit < eager ? limits.rndv_eager_limit
                                                                    : eager;
    m->super.btl_max_send_size = limits.max_send_size;
    m->super.btl_exclusivity = limits.exclusivity;
    m->super.btl_bandwidth = limits.bandwidth;
    m->super.btl_latency = c->latency;
    m->super.btl_flags = (MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_SEND_INPLACE) & c->flags;
    udbtl_rdma_enable(&m->super, limits.get_limit, c->flags);
    OPAL_THREAD_LOCK(&m->lock);
    m->datagram = limits.eager_limit;
    m->send_frags_max = limits.send_frags_max;
    m->silent_max = limits.send_frags_max / 2;
    m->throttle_at = m->silent_max + limits.send_frags_max / 8;
    OPAL_THREAD_UNLOCK(&m->lock);
}
