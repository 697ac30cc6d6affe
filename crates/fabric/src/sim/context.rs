//! An opened simulated device.

use std::mem;

use super::SimDeviceSpec;
use super::network::{Datagram, SimNetwork};
use super::{DEVICE_ATTR, sim_port};
use crate::bookkeeping::Verbs;
use crate::types::*;
use crate::{CompletionChannel, Context, FabricError, PostError, Result};

/// Top bit of a queue key in a send request: "use the sending queue pair's
/// own key instead", as in verbs.
const QKEY_FROM_QP: u32 = 0x8000_0000;

/// An opened simulated device: the verbs of [`Context`] over a
/// [`SimNetwork`].
///
/// Queue pairs carry nothing of their own (`()`); an address handle resolves
/// to the destination port id. Dropping the context forgets its queue pairs,
/// and datagrams still in flight to them are dropped and counted by the
/// network.
#[derive(Debug)]
pub struct SimContext {
    net: SimNetwork,
    /// Index of the device in the network.
    device: usize,
    /// Network-wide ids of the device's ports; port `n` is at index `n - 1`.
    port_ids: Vec<u32>,
    verbs: Verbs<(), u32>,
    /// Reused by `poll_cq` for the queue pairs that receive into the polled
    /// completion queue, so polling does not allocate.
    scratch: Vec<(u32, QpHandle)>,
    /// Whether the device reads a send's bytes only when it sends it
    /// ([`SimDeviceSpec::late_send_reads`]).
    late_send_reads: bool,
    /// Sends posted while the network held them, oldest first.
    held: Vec<HeldSend>,
}

/// What a send request says besides its bytes.
#[derive(Debug, Clone, Copy)]
struct SendHeader {
    wr_id: u64,
    ah: AhHandle,
    remote_qpn: u32,
    remote_qkey: u32,
    imm: Option<u32>,
    flags: SendFlags,
}

impl SendHeader {
    const fn of(wr: &SendWr<'_>) -> Self {
        Self {
            wr_id: wr.wr_id,
            ah: wr.ah,
            remote_qpn: wr.remote_qpn,
            remote_qkey: wr.remote_qkey,
            imm: wr.imm,
            flags: wr.flags,
        }
    }
}

/// A send posted while the network held sends: checked, its bytes not read.
#[derive(Debug)]
struct HeldSend {
    qp: QpHandle,
    header: SendHeader,
    parts: Vec<HeldPart>,
}

/// Where a held send's bytes are.
#[derive(Debug)]
enum HeldPart {
    /// In registered memory, read when the send is let go, as an adapter
    /// would read it.
    Registered(Sge),
    /// Caller memory, copied when posted: the simulator cannot keep a
    /// reference to it.
    Copied(Vec<u8>),
}

impl SimContext {
    pub(crate) fn new(
        net: SimNetwork,
        device: usize,
        info: DeviceInfo,
        spec: &SimDeviceSpec,
        port_ids: Vec<u32>,
    ) -> Self {
        let ports = port_ids
            .iter()
            .zip(1u8..)
            .map(|(&id, port_num)| PortAttr {
                port_num,
                // Refreshed from the network on every query.
                state: PortState::Active,
                addr: NodeAddr::Sim(id),
                max_msg_size: spec.max_msg_size,
                packet_size: spec.max_msg_size,
                network: spec.network,
                pkeys: vec![0xffff],
                link_layer: "sim",
            })
            .collect();
        Self {
            net,
            device,
            port_ids,
            verbs: Verbs::new(info, ports),
            scratch: Vec::new(),
            late_send_reads: spec.late_send_reads,
            held: Vec::new(),
        }
    }

    /// The network this context's device lives on.
    pub const fn network(&self) -> &SimNetwork {
        &self.net
    }

    /// The network-wide id of a port of this device.
    ///
    /// # Errors
    /// [`FabricError::NoSuchPort`].
    pub fn port_id(&self, port: u8) -> Result<u32> {
        usize::from(port)
            .checked_sub(1)
            .and_then(|i| self.port_ids.get(i))
            .copied()
            .ok_or_else(|| FabricError::NoSuchPort {
                device: self.verbs.device.name.clone(),
                port,
            })
    }

    /// Checks one send, copies its bytes and hands it to the network.
    fn send_one(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<()> {
        let len = self.verbs.check_send(self.verbs.qp(qp)?, wr)?;
        let mut payload = Vec::with_capacity(len);
        for gather in wr.sg_list {
            payload.extend_from_slice(self.verbs.gather_bytes(gather));
        }
        self.transmit(qp, SendHeader::of(wr), payload)
    }

    /// Checks one send and keeps it, unread, until the network lets sends
    /// go.
    fn hold(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<()> {
        self.verbs.check_send(self.verbs.qp(qp)?, wr)?;
        let parts = wr
            .sg_list
            .iter()
            .map(|gather| match gather {
                Gather::Registered(sge) => HeldPart::Registered(*sge),
                Gather::User { data, .. } => HeldPart::Copied(data.to_vec()),
            })
            .collect();
        self.held.push(HeldSend {
            qp,
            header: SendHeader::of(wr),
            parts,
        });
        Ok(())
    }

    /// Reads and sends the held sends, in order, unless the network still
    /// holds them. A send whose queue pair is gone meanwhile is dropped.
    fn release_held(&mut self) {
        if self.held.is_empty() || self.net.lock().sends_held {
            return;
        }
        for send in mem::take(&mut self.held) {
            let mut payload = Vec::new();
            for part in &send.parts {
                match part {
                    HeldPart::Registered(sge) => payload
                        .extend_from_slice(self.verbs.gather_bytes(&Gather::Registered(*sge))),
                    HeldPart::Copied(bytes) => payload.extend_from_slice(bytes),
                }
            }
            let _ = self.transmit(send.qp, send.header, payload);
        }
    }

    /// Hands a checked send's bytes to the network and completes it.
    fn transmit(&mut self, qp: QpHandle, wr: SendHeader, payload: Vec<u8>) -> Result<()> {
        let entry = self.verbs.qp(qp)?;
        let len = payload.len();
        let qkey = if wr.remote_qkey & QKEY_FROM_QP != 0 {
            entry.qkey
        } else {
            wr.remote_qkey
        };
        let src_port = self.port_id(entry.port)?;
        let datagram = Datagram {
            src: QpAddr {
                node: NodeAddr::Sim(src_port),
                qpn: entry.qp_num,
            },
            pkey: entry.pkey,
            qkey,
            imm: wr.imm,
            payload,
        };
        let dst_port = self.verbs.ah(wr.ah)?.route;
        self.net
            .lock()
            .transmit(src_port, dst_port, wr.remote_qpn, datagram);
        self.verbs.complete_send(qp, (wr.wr_id, wr.flags), len);
        Ok(())
    }
}

impl Drop for SimContext {
    fn drop(&mut self) {
        let mut net = self.net.lock();
        for (_, qp) in self.verbs.qps.iter() {
            net.unregister_qp(qp.qp_num);
        }
    }
}

impl Context for SimContext {
    crate::bookkeeping::delegate_to_verbs!();

    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        self.verbs.check_send(self.verbs.qp(qp)?, wr)
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = self.verbs.port(port)?.clone();
        attr.state = self.net.lock().port_state(self.port_id(port)?);
        Ok(attr)
    }

    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        let cap = self.verbs.check_qp_init(pd, attr)?;
        let qpn = self.net.lock().register_qp(self.device)?;
        self.verbs
            .insert_qp(pd, attr, cap, qpn, ())
            .inspect_err(|_| {
                self.net.lock().unregister_qp(qpn);
            })
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        let qpn = self.verbs.qp(qp)?.qp_num;
        self.verbs.remove_qp(qp)?;
        self.net.lock().unregister_qp(qpn);
        Ok(())
    }

    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        // As on a real fabric, an address handle to a port that does not
        // exist is accepted; what is sent on it is lost.
        let dest = sim_port(attr.dest)?;
        if self.verbs.resources().ahs >= DEVICE_ATTR.max_ah as usize {
            return Err(FabricError::ResourceExhausted {
                what: "address handles",
                limit: DEVICE_ATTR.max_ah,
            });
        }
        self.verbs.insert_ah(pd, attr, dest)
    }

    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.verbs.post_recv(qp, wrs)
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.release_held();
        let hold = self.late_send_reads && self.net.lock().sends_held;
        for (posted, wr) in wrs.iter().enumerate() {
            let sent = if hold {
                self.hold(qp, wr)
            } else {
                self.send_one(qp, wr)
            };
            sent.map_err(|error| PostError { posted, error })?;
        }
        Ok(())
    }

    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        self.release_held();
        let mut targets = mem::take(&mut self.scratch);
        targets.clear();
        targets.extend(
            self.verbs
                .qps
                .iter()
                .filter(|(_, qp)| qp.recv_cq == cq)
                .map(|(handle, qp)| (qp.qp_num, QpHandle(handle))),
        );
        if !targets.is_empty() {
            let mut net = self.net.lock();
            // A delivery that the queue pair refuses (no buffer, bad key)
            // takes no completion slot, so room is checked per datagram.
            while self.verbs.cq_room(cq) > 0 {
                let Some((qpn, datagram)) = net.pop_arrived(targets.iter().map(|(qpn, _)| *qpn))
                else {
                    break;
                };
                let Some(&(_, handle)) = targets.iter().find(|(n, _)| *n == qpn) else {
                    break;
                };
                self.verbs.deliver(
                    handle,
                    datagram.src,
                    datagram.pkey,
                    datagram.qkey,
                    datagram.imm,
                    &datagram.payload,
                );
            }
        }
        self.scratch = targets;
        self.verbs.drain_completions(cq, out)
    }

    /// `None`: datagrams move only as the network's virtual clock is driven,
    /// so there is nothing to block a thread on.
    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>> {
        self.verbs
            .cqs
            .get(cq.0)
            .map(|_| None)
            .ok_or(FabricError::InvalidHandle {
                kind: "completion queue",
            })
    }

    fn now(&self) -> std::time::Duration {
        self.net.now()
    }

    fn stats(&self) -> FabricStats {
        self.verbs.stats
    }

    fn resources(&self) -> ResourceCounts {
        self.verbs.resources()
    }
}
