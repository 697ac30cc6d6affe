/*
 * mca_btl_udbtl: gets between two processes of one host, in one copy.
 *
 * A get over the network costs three copies of every byte: the owner's
 * kernel copies it into a socket buffer, the reader's kernel copies it out
 * into udbtl's receive buffer, and udbtl copies it into ob1's receive
 * buffer. Where the reader and the owner of a registered buffer run on one
 * host, the reader copies it once, straight from the owner's memory, with
 * process_vm_readv (cross-memory attach, as Open MPI's vader BTL and UCX's
 * cma transport do).
 *
 * "One host" is one host name, kernel boot, PID namespace and network
 * namespace (udbtl_rs_memory_domain): processes in two network namespaces
 * are treated as two hosts, as the stand-in hosts of the tests are, so
 * traffic between them stays on the network. A registration handle carries
 * its owner's host identity and PID; ob1 hands it to the reader in its
 * RGET header.
 *
 * The kernel lets the reader in where it may ptrace the owner: the same
 * user, and neither Yama's ptrace_scope nor a non-dumpable owner in the
 * way, or CAP_SYS_PTRACE. Where it refuses, the module stops trying and its
 * gets go over the network as before. Any other failure sends that one get
 * over the network, which reports what is wrong (a range the owner never
 * registered, a lost peer) as it always has.
 */

#include "udbtl.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>

#include "opal/util/output.h"

/* ----- registrations ---------------------------------------------------- */

void udbtl_local_stamp(mca_btl_base_registration_handle_t *handle)
{
    handle->host = mca_btl_udbtl_component.local_host;
    handle->pid = mca_btl_udbtl_component.local_pid;
    handle->reserved = 0;
}

/* ----- reading ---------------------------------------------------------- */

int udbtl_local_read(udbtl_module_t *m, void *local, uint64_t remote, size_t size,
                     const mca_btl_base_registration_handle_t *handle)
{
    const udbtl_component_t *c = &mca_btl_udbtl_component;
    if (0 == c->local_host || handle->host != c->local_host || handle->pid <= 0
        || handle->pid == c->local_pid
        || __atomic_load_n(&m->local_read_refused, __ATOMIC_RELAXED)) {
        return OPAL_ERR_NOT_AVAILABLE;
    }
    size_t done = 0;
    while (done < size) {
        struct iovec to = {.iov_base = (char *) local + done, .iov_len = size - done};
        struct iovec from = {.iov_base = (void *) (uintptr_t) (remote + done),
                             .iov_len = size - done};
        ssize_t got = process_vm_readv((pid_t) handle->pid, &to, 1, &from, 1, 0);
        if (got > 0) {
            done += (size_t) got;
            continue;
        }
        int error = got < 0 ? errno : 0;
        if ((EPERM == error || ENOSYS == error)
            && !__atomic_exchange_n(&m->local_read_refused, true, __ATOMIC_RELAXED)) {
            opal_output_verbose(1, opal_btl_base_framework.framework_output,
                                "btl udbtl: reading a process of this host in one copy was "
                                "refused (%s); gets go over the network",
                                strerror(error));
        }
        /* Whatever landed is written again by the get over the network. */
        return OPAL_ERR_NOT_AVAILABLE;
    }
    __atomic_fetch_add(&m->gets_local, 1, __ATOMIC_RELAXED);
    return OPAL_SUCCESS;
}
