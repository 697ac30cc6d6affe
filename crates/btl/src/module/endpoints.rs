//! The module's peers: the endpoint table, the index from a sender's queue
//! pair address to its endpoint, and the one-entry cache in front of it.

use std::collections::HashMap;

use udbtl_fabric::{AhHandle, QpAddr};
use udbtl_wire::modex;

use crate::{EndpointId, NUM_QP};

/// One peer module as this module sees it.
#[derive(Debug)]
pub(super) struct Endpoint {
    /// The peer's receiving queue pair.
    pub(super) remote: QpAddr,
    /// Every queue pair the peer sends from.
    pub(super) senders: [QpAddr; modex::QPNS],
    /// The peer process's id, which its reliable datagrams carry.
    pub(super) proc_id: u32,
    pub(super) ah: AhHandle,
    /// The caller's value for this endpoint, handed to receive callbacks.
    pub(super) context: Option<u64>,
}

/// Where a datagram to one endpoint goes, and which of our queue pairs sends
/// it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Route {
    pub(super) ah: AhHandle,
    pub(super) remote_qpn: u32,
    /// Index of the sending queue pair. One peer's stream always leaves by
    /// the same queue pair, so the receiver's last-sender cache hits and the
    /// stream is never reordered between sockets; peers are striped over the
    /// queue pairs.
    pub(super) qp_index: usize,
}

/// The endpoint table.
#[derive(Debug, Default)]
pub(super) struct Endpoints {
    table: Vec<Option<Endpoint>>,
    /// Slots free for reuse. Only unreliable modules reuse slots: a reliable
    /// endpoint's id is its peer id in the reliability state, which lingers
    /// after the endpoint is deleted.
    free: Vec<u32>,
    by_addr: HashMap<QpAddr, EndpointId>,
    /// The sender of the last datagram received, and its endpoint: most
    /// traffic comes in runs from one peer, which then costs no hash lookup.
    last_sender: Option<(QpAddr, EndpointId)>,
}

impl Endpoints {
    /// The endpoint a peer module's receiving queue pair already has.
    pub(super) fn existing(&self, remote: QpAddr) -> Option<EndpointId> {
        self.by_addr.get(&remote).copied()
    }

    /// The id the next [`insert`](Self::insert) will use when slots are not
    /// reused.
    pub(super) fn next_fresh_id(&self) -> EndpointId {
        EndpointId(self.table.len() as u32)
    }

    /// Stores an endpoint, reusing a free slot when `reuse` allows, and
    /// indexes every queue pair it sends from.
    pub(super) fn insert(&mut self, endpoint: Endpoint, reuse: bool) -> EndpointId {
        let senders = endpoint.senders;
        let id = match self.free.pop().filter(|_| reuse) {
            Some(slot) => {
                self.table[slot as usize] = Some(endpoint);
                EndpointId(slot)
            }
            None => {
                self.table.push(Some(endpoint));
                EndpointId((self.table.len() - 1) as u32)
            }
        };
        for qp in senders.iter().filter(|qp| qp.qpn != 0) {
            self.by_addr.insert(*qp, id);
        }
        id
    }

    /// Removes an endpoint and its index entries; its slot is reused later
    /// only if `reuse`.
    pub(super) fn remove(&mut self, id: EndpointId, reuse: bool) -> Option<Endpoint> {
        let endpoint = self.table.get_mut(id.0 as usize)?.take()?;
        for qp in &endpoint.senders {
            self.by_addr.remove(qp);
        }
        self.last_sender = None;
        if reuse {
            self.free.push(id.0);
        }
        Some(endpoint)
    }

    pub(super) fn get(&self, id: EndpointId) -> Option<&Endpoint> {
        self.table.get(id.0 as usize)?.as_ref()
    }

    pub(super) fn get_mut(&mut self, id: EndpointId) -> Option<&mut Endpoint> {
        self.table.get_mut(id.0 as usize)?.as_mut()
    }

    /// The endpoint a datagram from `src` came from: the cache, then the
    /// index.
    pub(super) fn lookup(&mut self, src: QpAddr) -> Option<EndpointId> {
        match self.last_sender {
            Some((addr, id)) if addr == src => Some(id),
            _ => {
                let id = self.by_addr.get(&src).copied()?;
                self.last_sender = Some((src, id));
                Some(id)
            }
        }
    }

    /// Where datagrams to `id` go.
    pub(super) fn route(&self, id: EndpointId) -> Option<Route> {
        let endpoint = self.get(id)?;
        Some(Route {
            ah: endpoint.ah,
            remote_qpn: endpoint.remote.qpn,
            qp_index: id.0 as usize % NUM_QP,
        })
    }

    /// The caller's value attached to an endpoint.
    pub(super) fn context(&self, id: Option<EndpointId>) -> Option<u64> {
        self.get(id?)?.context
    }

    /// Ids of the live endpoints.
    pub(super) fn ids(&self) -> impl Iterator<Item = EndpointId> + '_ {
        self.table
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_some())
            .map(|(i, _)| EndpointId(i as u32))
    }

    /// Number of live endpoints.
    pub(super) fn len(&self) -> usize {
        self.table.iter().filter(|e| e.is_some()).count()
    }
}
