//! The module's peers: addressing (`address`, `add_procs`, `del_procs`),
//! the endpoint table, the index from a sender's queue pair address to its
//! endpoint, and the one-entry cache in front of it.
//!
//! A module sends from [`NUM_QP`](crate::NUM_QP) queue pairs, peers
//! striped over them, and receives on the first. Which one sends to a peer
//! is decided by the peer's receiving queue pair number ([`sending_qp`]),
//! so the receiver knows it too: it indexes one address per peer, not
//! every queue pair the peer has.

use std::collections::HashMap;

use udbtl_fabric::{AhAttr, AhHandle, Context, FabricError, NodeAddr, PortAttr, QpAddr, QpInfo};
use udbtl_reliability::{Instant, PeerId, StreamStart};
use udbtl_wire::datagram::AuthKey;

use super::seal::PairSeal;
use udbtl_wire::modex;

use super::Engine;
use super::limits::usable_size;
use crate::error::{BtlError, SendFailure};
use crate::params::MIN_EAGER_PAYLOAD;
use crate::{EndpointId, sending_qp};

/// One peer module as this module sees it.
#[derive(Debug)]
pub(super) struct Endpoint {
    /// Where the peer's port is.
    pub(super) node: NodeAddr,
    /// The queue pair the peer receives on.
    pub(super) remote_qpn: u32,
    /// The queue pair the peer sends to this module from.
    pub(super) sender_qpn: u32,
    /// The peer process's id, which its reliable datagrams carry.
    pub(super) proc_id: u32,
    /// The key of the peer's job, which its datagrams carry: this module's
    /// own, unless the peer was started by another job (see
    /// `Module::set_endpoint_job`).
    pub(super) job_key: u32,
    /// The job key field of every BTL header to the peer: this module's job
    /// key XORed with the peer's mask.
    pub(super) header_job_key: u32,
    /// The Q_Key every datagram to the peer carries.
    pub(super) remote_qkey: u32,
    /// The peer module's receive key: what goes to it is sealed under keys
    /// derived from it (modules with `auth` only).
    pub(super) auth_key: Option<Box<AuthKey>>,
    /// Packet numbers, replay window and keys of sealed datagrams to and
    /// from the peer, made when the first is sealed or opened.
    pub(super) seal: Option<Box<PairSeal>>,
    pub(super) ah: AhHandle,
    /// The caller's value for this endpoint, handed to receive callbacks.
    pub(super) context: Option<u64>,
}

impl Endpoint {
    /// The peer's receiving queue pair.
    pub(super) const fn remote(&self) -> QpAddr {
        QpAddr {
            node: self.node,
            qpn: self.remote_qpn,
        }
    }

    /// The queue pair the peer sends to this module from.
    const fn sender(&self) -> QpAddr {
        QpAddr {
            node: self.node,
            qpn: self.sender_qpn,
        }
    }
}

/// Where a datagram to one endpoint goes, and which of our queue pairs sends
/// it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Route {
    pub(super) ah: AhHandle,
    pub(super) remote_qpn: u32,
    pub(super) remote_qkey: u32,
    /// The job key field of a BTL header to the peer ([`Endpoint::header_job_key`]).
    pub(super) header_job_key: u32,
    /// Index of the sending queue pair ([`sending_qp`]). One peer's stream
    /// always leaves by the same queue pair, so the receiver knows its
    /// address, its last-sender cache hits and the stream is never
    /// reordered between sockets.
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
    /// By the queue pair each peer sends to this module from.
    by_addr: HashMap<QpAddr, EndpointId>,
    /// The sender of the last datagram received, and its endpoint: most
    /// traffic comes in runs from one peer, which then costs no hash lookup.
    last_sender: Option<(QpAddr, EndpointId)>,
}

impl Endpoints {
    /// The endpoint of the peer module that sends to this one from
    /// `sender`, if it has one already.
    pub(super) fn existing(&self, sender: QpAddr) -> Option<EndpointId> {
        self.by_addr.get(&sender).copied()
    }

    /// Heap bytes per endpoint: its slot and its index entries.
    pub(in crate::module) const fn bytes_per_endpoint() -> usize {
        size_of::<Option<Endpoint>>() + size_of::<QpAddr>() + size_of::<EndpointId>() + 1
    }

    /// Makes room for `additional` more endpoints at once.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.table.reserve(additional);
        self.by_addr.reserve(additional);
    }

    /// The id the next [`insert`](Self::insert) will use when slots are not
    /// reused.
    pub(super) fn next_fresh_id(&self) -> EndpointId {
        EndpointId(self.table.len() as u32)
    }

    /// Stores an endpoint, reusing a free slot when `reuse` allows, and
    /// indexes the queue pair it sends from.
    pub(super) fn insert(&mut self, endpoint: Endpoint, reuse: bool) -> EndpointId {
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
        if let Some(endpoint) = &self.table[id.0 as usize] {
            self.by_addr.insert(endpoint.sender(), id);
        }
        id
    }

    /// Removes an endpoint and its index entries; its slot is reused later
    /// only if `reuse`.
    pub(super) fn remove(&mut self, id: EndpointId, reuse: bool) -> Option<Endpoint> {
        let endpoint = self.table.get_mut(id.0 as usize)?.take()?;
        self.by_addr.remove(&endpoint.sender());
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
            remote_qpn: endpoint.remote_qpn,
            remote_qkey: endpoint.remote_qkey,
            header_job_key: endpoint.header_job_key,
            qp_index: sending_qp(endpoint.remote_qpn),
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

/// The result of [`Module::add_procs`](super::Module::add_procs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddProcs {
    /// One slot per peer: its endpoint, or `None` if unreachable.
    pub endpoints: Vec<Option<EndpointId>>,
    /// Bit `i` is set when peer `i` is reachable (the BTL's bitmap).
    pub reachable: Vec<bool>,
}

/// The fabric address of a published location.
fn node_of(location: modex::Location) -> NodeAddr {
    match location {
        modex::Location::Ipv4(ip) => NodeAddr::Ip(ip.into()),
        modex::Location::Ipv6(ip) => NodeAddr::Ip(ip.into()),
        modex::Location::Sim(id) => NodeAddr::Sim(id),
        modex::Location::Ib { lid, gid } => NodeAddr::Ib { lid, gid },
    }
}

fn describe_auth(auth: modex::Auth) -> &'static str {
    match auth {
        modex::Auth::Off => "off",
        modex::Auth::Key(_) => "on with published keys",
        modex::Auth::Derived => "on with keys from the job secret",
    }
}

/// The address a module on `port` with queue pairs `qps` publishes.
pub(super) fn module_address(
    port: &PortAttr,
    qps: &[QpInfo],
    proc_id: u32,
    auth: modex::Auth,
    stream_nonce: u32,
    admission: modex::Admission,
) -> modex::Address {
    modex::Address {
        location: match port.addr {
            NodeAddr::Ip(std::net::IpAddr::V4(ip)) => modex::Location::Ipv4(ip.octets()),
            NodeAddr::Ip(std::net::IpAddr::V6(ip)) => modex::Location::Ipv6(ip.octets()),
            NodeAddr::Sim(id) => modex::Location::Sim(id),
            NodeAddr::Ib { lid, gid } => modex::Location::Ib { lid, gid },
            _ => modex::Location::Sim(u32::MAX),
        },
        port: port.port_num,
        qpns: core::array::from_fn(|i| qps.get(i).map_or(0, |qp| qp.qp_num)),
        proc_id,
        max_msg_size: u32::try_from(port.max_msg_size).unwrap_or(u32::MAX),
        packet_size: u32::try_from(port.packet_size).unwrap_or(u32::MAX),
        network: port.network,
        stream_nonce,
        admission,
        auth,
    }
}

impl<C: Context> Engine<C> {
    /// The engine's side of `Module::address`, whose documentation is the
    /// contract.
    pub(super) fn address(&self) -> modex::Address {
        let auth = self
            .path
            .reliable()
            .map_or(modex::Auth::Off, |r| r.integrity.auth());
        let nonce = self.path.reliable().map_or(0, |r| r.stream_nonce);
        module_address(
            &self.port,
            &self.qps,
            self.proc_id,
            auth,
            nonce,
            self.admission,
        )
    }

    /// The engine's side of `Module::add_procs`, whose documentation is the
    /// contract.
    pub(super) fn add_procs(
        &mut self,
        peers: &[Option<&[modex::Address]>],
    ) -> Result<AddProcs, BtlError> {
        let mut result = AddProcs {
            endpoints: vec![None; peers.len()],
            reachable: vec![false; peers.len()],
        };
        let mut mismatched = None;
        self.endpoints.reserve(peers.len());
        if let Some(reliable) = self.path.reliable_mut() {
            reliable.core.reserve_peers(peers.len());
        }
        for (i, peer) in peers.iter().enumerate() {
            let Some(chosen) = peer.and_then(|addrs| self.pick_address(addrs)) else {
                continue;
            };
            let peer_key = match self.path.reliable() {
                Some(reliable) => reliable.integrity.peer_key(&chosen),
                None if chosen.auth == modex::Auth::Off => Some(None),
                None => None,
            };
            let Some(peer_key) = peer_key else {
                // Neither side could read the other's datagrams.
                mismatched.get_or_insert((i, chosen.auth));
                continue;
            };
            let own = (self.port.max_msg_size, self.port.packet_size);
            let peer = (chosen.max_msg_size as usize, chosen.packet_size as usize);
            if !self.fit_peer_datagrams(usable_size(own, peer)) {
                continue;
            }
            match self.add_endpoint(&chosen, peer_key) {
                Ok(id) => {
                    result.endpoints[i] = Some(id);
                    result.reachable[i] = true;
                }
                Err(err) => {
                    let created: Vec<EndpointId> =
                        result.endpoints.iter().flatten().copied().collect();
                    let _ = self.del_procs(&created);
                    return Err(err);
                }
            }
        }
        if let Some((first, theirs)) = mismatched {
            let ours = self.address().auth;
            let hint = if ours == modex::Auth::Off || theirs == modex::Auth::Off {
                "set UDBTL_AUTH alike on every process"
            } else {
                "only some processes hold the launcher's job secret: start every rank \
                 with the same launcher"
            };
            tracing::warn!(
                first_peer = first,
                "peers unreachable: auth is {} here and {} there; {hint}",
                describe_auth(ours),
                describe_auth(theirs),
            );
        }
        Ok(result)
    }

    /// Makes every datagram this module sends fit a peer whose port takes
    /// at most `peer_max` bytes ([`usable_size`]): on a network
    /// that mixes jumbo frames and 1500-byte hosts, the larger datagrams
    /// would be dropped on the way and resent until the peer was declared
    /// lost. The module's payload limits shrink to the peer's, for every
    /// peer (ob1 takes one set of limits per module). Returns `false`, with
    /// a warning, when the peer's datagrams cannot even hold the smallest
    /// eager payload: that peer is unreachable through this module.
    fn fit_peer_datagrams(&mut self, peer_max: usize) -> bool {
        let fits = peer_max.saturating_sub(self.header_len);
        if fits >= self.limits.eager_limit {
            return true;
        }
        if fits < MIN_EAGER_PAYLOAD {
            tracing::warn!(
                device = %self.device,
                peer_max,
                "a peer's largest datagram ({peer_max} bytes) cannot hold a \
                 {MIN_EAGER_PAYLOAD}-byte message after the {}-byte header; it is unreachable \
                 through this module",
                self.header_len
            );
            return false;
        }
        tracing::warn!(
            device = %self.device,
            "a peer takes datagrams of at most {peer_max} bytes, fewer than this module's {}: \
             messages are cut to {fits}-byte datagrams from now on (set the same MTU, or \
             max_send_size, on every host of the network to avoid this)",
            self.header_len + self.limits.eager_limit
        );
        self.limits.eager_limit = fits;
        self.limits.max_send_size = fits;
        if !self.path.is_reliable() {
            self.limits.alloc_limit = fits;
            self.limits.frag_limit = fits;
        }
        self.limits.rndv_eager_limit = self.limits.rndv_eager_limit.min(fits);
        true
    }

    /// The peer address this module can reach: on the same network, the same
    /// kind of address, and a matching port number when the peer has several.
    pub(super) fn pick_address(&self, addrs: &[modex::Address]) -> Option<modex::Address> {
        let mine = self.address();
        let compatible = |a: &&modex::Address| {
            a.network == mine.network
                && core::mem::discriminant(&a.location) == core::mem::discriminant(&mine.location)
        };
        addrs
            .iter()
            .filter(compatible)
            .find(|a| a.port == mine.port)
            .or_else(|| addrs.iter().find(compatible))
            .copied()
    }

    /// Creates an endpoint for the peer module at `peer`, whose datagrams
    /// are recognised by the queue pair it sends to this module from
    /// ([`sending_qp`]), with an address handle
    /// built with the service level and path bits parameters. `auth_key` is
    /// the peer's receive key, which a module with `auth` needs to send to
    /// it. An endpoint that exists for the peer module is returned as it
    /// is.
    fn add_endpoint(
        &mut self,
        peer: &modex::Address,
        auth_key: Option<AuthKey>,
    ) -> Result<EndpointId, BtlError> {
        let node = node_of(peer.location);
        let own_qpn = self.qps.first().map_or(0, |qp| qp.qp_num);
        // A peer that publishes fewer queue pairs sends from its first.
        let sender_qpn = match peer.qpns[sending_qp(own_qpn)] {
            0 => peer.qpns[0],
            qpn => qpn,
        };
        if let Some(id) = self.endpoints.existing(QpAddr {
            node,
            qpn: sender_qpn,
        }) {
            return Ok(id);
        }
        let attr = AhAttr {
            dest: node,
            service_level: self.sl,
            src_path_bits: self.path_bits,
            port: self.port.port_num,
        };
        let ah = self
            .ctx
            .create_ah(self.pd, &attr)
            .map_err(|source| self.fabric_error("create address handle", source))?;
        let endpoint = Endpoint {
            node,
            remote_qpn: peer.qpns[0],
            sender_qpn,
            proc_id: peer.proc_id,
            job_key: self.job_key,
            header_job_key: self.job_key ^ peer.admission.job_key_mask,
            remote_qkey: peer.admission.qkey,
            auth_key: auth_key.map(Box::new),
            seal: None,
            ah,
            context: None,
        };
        let Some(reliable) = self.path.reliable_mut() else {
            return Ok(self.endpoints.insert(endpoint, true));
        };
        // A reliable endpoint's id is its peer id, and neither is reused: a
        // closed peer lingers.
        let peer = if reliable.fixed_stream_start {
            reliable.core.add_peer()
        } else {
            let own = reliable.stream_nonce;
            reliable.core.add_peer_at(StreamStart {
                send: modex::stream_start(own, peer.stream_nonce),
                recv: modex::stream_start(peer.stream_nonce, own),
            })
        };
        let now = Instant::from_duration(self.ctx.now());
        debug_assert_eq!(peer.0, self.endpoints.next_fresh_id().0);
        let id = self.endpoints.insert(endpoint, false);
        // The new peer's share counts from its first acknowledgement on.
        let (free, floor) = self.recv.credit_room(self.held_for_app, self.app_present);
        reliable.core.share_credit(now, free, floor);
        Ok(id)
    }

    /// The engine's side of `Module::del_procs`, whose documentation is the
    /// contract.
    pub(super) fn del_procs(&mut self, endpoints: &[EndpointId]) -> Result<(), BtlError> {
        // A held-back datagram is sent before its peer is closed.
        let now = Instant::from_duration(self.ctx.now());
        if self.close_open_carrier(now) {
            self.flush_transmits(now);
        }
        for &id in endpoints {
            let reuse = !self.path.is_reliable();
            let endpoint = self
                .endpoints
                .remove(id, reuse)
                .ok_or(BtlError::BadEndpoint { endpoint: id.0 })?;
            if let Some(reliable) = self.path.reliable_mut() {
                reliable
                    .core
                    .close_peer(Instant::from_duration(self.ctx.now()), PeerId(id.0));
            }
            let frags = &self.frags;
            let stranded = self
                .tx
                .sends
                .remove_where(|w| frags.get(w.des).is_some_and(|f| f.endpoint == id.0));
            for waiting in stranded {
                self.complete_send(
                    waiting.des,
                    Err(SendFailure::Refused("endpoint deleted".into())),
                );
            }
            self.ctx
                .destroy_ah(endpoint.ah)
                .map_err(|source| self.fabric_error("destroy address handle", source))?;
        }
        Ok(())
    }

    fn fabric_error(&self, step: &'static str, source: FabricError) -> BtlError {
        BtlError::Fabric {
            step,
            device: self.device.clone(),
            port: self.port.port_num,
            source,
        }
    }

    /// The engine's side of `Module::set_endpoint_context`, whose documentation is the
    /// contract.
    pub(super) fn set_endpoint_context(
        &mut self,
        endpoint: EndpointId,
        context: u64,
    ) -> Result<(), BtlError> {
        self.endpoints
            .get_mut(endpoint)
            .ok_or(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            })?
            .context = Some(context);
        Ok(())
    }

    /// The engine's side of `Module::set_endpoint_job`, whose documentation
    /// is the contract.
    pub(super) fn set_endpoint_job(
        &mut self,
        endpoint: EndpointId,
        job_key: u32,
    ) -> Result<(), BtlError> {
        self.endpoints
            .get_mut(endpoint)
            .ok_or(BtlError::BadEndpoint {
                endpoint: endpoint.0,
            })?
            .job_key = job_key;
        if job_key != self.job_key && !self.foreign_job_keys.contains(&job_key) {
            self.foreign_job_keys.push(job_key);
        }
        Ok(())
    }

    /// Whether datagrams carrying `job_key` may be from a peer: this job's,
    /// or the job of a peer added from another job. The common case costs
    /// one comparison.
    pub(super) fn accepts_job(&self, job_key: u32) -> bool {
        job_key == self.job_key || self.foreign_job_keys.contains(&job_key)
    }

    /// The engine's side of `Module::endpoint_addr`, whose documentation is the
    /// contract.
    pub(super) fn endpoint_addr(&self, endpoint: EndpointId) -> Option<QpAddr> {
        self.endpoints.get(endpoint).map(Endpoint::remote)
    }
}
