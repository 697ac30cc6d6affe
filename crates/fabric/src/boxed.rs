//! One provider type for every provider, chosen at run time: [`AnyProvider`]
//! and the contexts it opens, [`AnyContext`].
//!
//! Code generic over [`Provider`] (the BTL's `Component` and `Module`) runs
//! on these as on any provider, so a program that picks its provider from a
//! setting names one type whatever the choice. The price is one indirect
//! call per verb, through the [`Context`] implementation of `Box<C>` below:
//! the only layer the verbs are forwarded through. (Opening a device goes
//! through two more calls, [`AnyProvider`]'s and its adaptor's, once per
//! context.)

use core::fmt;
use core::time::Duration;

use crate::types::*;
use crate::{CompletionChannel, Context, PostError, Provider, Result};

/// An opened device of any provider: what [`AnyProvider::open`] returns.
///
/// It implements [`Context`] through the implementation for `Box<C>`, which
/// forwards each verb to the boxed context unchanged.
pub type AnyContext = Box<dyn Context>;

/// A boxed context is a context: every verb is forwarded, unchanged, to the
/// context in the box, which keeps its own semantics (errors, limits,
/// completion channel, clock).
///
/// This is the only layer the verbs are forwarded through between code
/// generic over [`Context`] and a provider chosen at run time:
/// [`AnyContext`] is `Box<dyn Context>`, and [`AnyProvider`] hands out
/// nothing else.
impl<C: Context + ?Sized> Context for Box<C> {
    fn device(&self) -> &DeviceInfo {
        (**self).device()
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        (**self).query_port(port)
    }

    fn alloc_pd(&mut self) -> Result<PdHandle> {
        (**self).alloc_pd()
    }

    fn dealloc_pd(&mut self, pd: PdHandle) -> Result<()> {
        (**self).dealloc_pd(pd)
    }

    fn reg_mr(&mut self, pd: PdHandle, len: usize) -> Result<Mr> {
        (**self).reg_mr(pd, len)
    }

    fn reg_user_mr(&mut self, pd: PdHandle, region: &[u8]) -> Result<Mr> {
        (**self).reg_user_mr(pd, region)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        (**self).dereg_mr(mr)
    }

    fn mr_bytes(&self, mr: MrHandle) -> Result<&[u8]> {
        (**self).mr_bytes(mr)
    }

    fn mr_bytes_mut(&mut self, mr: MrHandle) -> Result<&mut [u8]> {
        (**self).mr_bytes_mut(mr)
    }

    fn mr_bytes_pair(&mut self, from: MrHandle, to: MrHandle) -> Result<(&[u8], &mut [u8])> {
        (**self).mr_bytes_pair(from, to)
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqHandle> {
        (**self).create_cq(depth)
    }

    fn destroy_cq(&mut self, cq: CqHandle) -> Result<()> {
        (**self).destroy_cq(cq)
    }

    fn create_qp(&mut self, pd: PdHandle, attr: &QpInitAttr) -> Result<QpInfo> {
        (**self).create_qp(pd, attr)
    }

    fn modify_qp(&mut self, qp: QpHandle, transition: &QpTransition) -> Result<()> {
        (**self).modify_qp(qp, transition)
    }

    fn qp_state(&self, qp: QpHandle) -> Result<QpState> {
        (**self).qp_state(qp)
    }

    fn destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        (**self).destroy_qp(qp)
    }

    fn create_ah(&mut self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        (**self).create_ah(pd, attr)
    }

    fn destroy_ah(&mut self, ah: AhHandle) -> Result<()> {
        (**self).destroy_ah(ah)
    }

    fn post_recv(&mut self, qp: QpHandle, wrs: &[RecvWr]) -> Result<(), PostError> {
        (**self).post_recv(qp, wrs)
    }

    fn check_send(&self, qp: QpHandle, wr: &SendWr<'_>) -> Result<usize> {
        (**self).check_send(qp, wr)
    }

    fn post_send(&mut self, qp: QpHandle, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        (**self).post_send(qp, wrs)
    }

    fn poll_cq(&mut self, cq: CqHandle, out: &mut [WorkCompletion]) -> Result<usize> {
        (**self).poll_cq(cq, out)
    }

    fn completion_channel(&mut self, cq: CqHandle) -> Result<Option<CompletionChannel>> {
        (**self).completion_channel(cq)
    }

    fn now(&self) -> Duration {
        (**self).now()
    }

    fn stats(&self) -> FabricStats {
        (**self).stats()
    }

    fn resources(&self) -> ResourceCounts {
        (**self).resources()
    }
}

/// Any provider, chosen at run time: a [`Provider`] whose contexts are
/// [`AnyContext`]s.
///
/// [`name`](Provider::name), [`devices`](Provider::devices) and
/// [`open`](Provider::open) answer as the wrapped provider does; `open`
/// boxes the context it opened. The wrapped provider is `Send + Sync`, as
/// every provider of this crate is, so an `AnyProvider` may be shared
/// between threads.
pub struct AnyProvider {
    inner: Box<dyn Provider<Context = AnyContext> + Send + Sync>,
}

impl AnyProvider {
    /// Wraps `provider`. Wrapping an `AnyProvider` again works but boxes
    /// its contexts twice: pass the provider itself instead.
    pub fn new<P>(provider: P) -> Self
    where
        P: Provider + Send + Sync + 'static,
    {
        Self {
            inner: Box::new(Boxing(provider)),
        }
    }
}

impl fmt::Debug for AnyProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnyProvider")
            .field("name", &self.inner.name())
            .finish_non_exhaustive()
    }
}

impl Provider for AnyProvider {
    type Context = AnyContext;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        self.inner.devices()
    }

    fn open(&self, device: &str) -> Result<AnyContext> {
        self.inner.open(device)
    }
}

/// The adaptor inside an [`AnyProvider`]: `P`, with the contexts it opens
/// boxed.
struct Boxing<P>(P);

impl<P: Provider> Provider for Boxing<P> {
    type Context = AnyContext;

    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        self.0.devices()
    }

    fn open(&self, device: &str) -> Result<AnyContext> {
        let ctx: AnyContext = Box::new(self.0.open(device)?);
        Ok(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimDeviceSpec, SimNetwork};

    /// An `AnyProvider` answers as the provider it wraps, and its contexts
    /// run the verbs of the wrapped provider's contexts.
    #[test]
    fn any_provider_answers_as_the_wrapped_provider() {
        let net = SimNetwork::new(1);
        let sim = net.provider();
        sim.add_device(SimDeviceSpec::new("sim0", 1))
            .expect("device");
        let any = AnyProvider::new(sim.clone());
        assert_eq!(any.name(), sim.name());
        assert_eq!(
            any.devices().expect("devices"),
            sim.devices().expect("devices")
        );
        assert!(format!("{any:?}").contains(sim.name()));

        let mut ctx = any.open("sim0").expect("open");
        assert_eq!(ctx.device().name, "sim0");
        let pd = ctx.alloc_pd().expect("pd");
        let mr = ctx.reg_mr(pd, 64).expect("mr");
        ctx.mr_bytes_mut(mr.handle).expect("bytes")[0] = 7;
        assert_eq!(ctx.mr_bytes(mr.handle).expect("bytes")[0], 7);
        assert!(!ctx.resources().is_empty());
        ctx.dereg_mr(mr.handle).expect("dereg");
        ctx.dealloc_pd(pd).expect("dealloc");
        assert!(ctx.resources().is_empty());
        assert!(any.open("nothing").is_err());
    }
}
