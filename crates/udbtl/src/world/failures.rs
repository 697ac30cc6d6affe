//! What the transport reported lost, as [`World::check`](super::World::check)
//! tells it: by the rank behind each route.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use udbtl_btl::{EndpointId, ErrorEvent, SendEvent};

/// The way to one peer: the module that reaches it and its endpoint there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Route {
    /// Index of the module among the component's.
    pub(super) module: usize,
    /// The peer's endpoint on that module.
    pub(super) endpoint: EndpointId,
}

/// What the transport's callbacks reported as lost, with a flag that lets
/// [`World::check`](super::World::check) answer "nothing" with one atomic
/// load: programs call it in their busy-wait loops, where a lock would cost
/// latency.
#[derive(Debug, Default)]
pub(super) struct FailureLog {
    any: AtomicBool,
    failures: Mutex<Failures>,
}

impl FailureLog {
    /// The failures, for reading.
    pub(super) fn lock(&self) -> MutexGuard<'_, Failures> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a failed send on `module`.
    pub(super) fn record_send(&self, module: usize, event: &SendEvent) {
        if event.status.is_err() {
            let route = Route {
                module,
                endpoint: event.endpoint,
            };
            self.lock().record_failed_send(route);
            self.any.store(true, Ordering::Release);
        }
    }

    /// Records an error `module` reported.
    pub(super) fn record_error(&self, module: usize, event: &ErrorEvent) {
        self.lock().record_error(module, event);
        self.any.store(true, Ordering::Release);
    }

    /// Whether anything was recorded.
    pub(super) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }
}

/// The failures recorded, by route.
#[derive(Debug, Default)]
pub(super) struct Failures {
    /// Peers declared lost, with the transport's account.
    pub(super) lost: Vec<(Route, String)>,
    /// Sends that failed, counted per peer.
    pub(super) failed_sends: Vec<(Route, u64)>,
    /// Errors naming no peer.
    pub(super) other: Vec<String>,
}

impl Failures {
    pub(super) fn is_empty(&self) -> bool {
        self.lost.is_empty() && self.failed_sends.is_empty() && self.other.is_empty()
    }

    fn record_failed_send(&mut self, route: Route) {
        match self.failed_sends.iter_mut().find(|(r, _)| *r == route) {
            Some((_, count)) => *count += 1,
            None => self.failed_sends.push((route, 1)),
        }
    }

    fn record_error(&mut self, module: usize, event: &ErrorEvent) {
        match event.endpoint {
            Some(endpoint) => {
                let route = Route { module, endpoint };
                if !self.lost.iter().any(|(r, _)| *r == route) {
                    self.lost.push((route, event.message.clone()));
                }
            }
            None => self.other.push(event.message.clone()),
        }
    }
}

/// How `check` names the peer behind `route`: by its rank, with the
/// endpoint number the transport's own messages use when the two differ
/// (addresses fetched lazily number endpoints in order of first use).
pub(super) fn peer_name(routes: &[Option<Route>], route: Route) -> String {
    let endpoint = route.endpoint.raw();
    match routes.iter().position(|r| *r == Some(route)) {
        Some(rank) if u32::try_from(rank) == Ok(endpoint) => format!("rank {rank}"),
        Some(rank) => format!("rank {rank} (endpoint {endpoint})"),
        None => format!("endpoint {endpoint}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_named_by_rank_and_by_endpoint_when_it_differs() {
        let on = |module, raw| Route {
            module,
            endpoint: EndpointId::from_raw(raw),
        };
        let routes = [Some(on(0, 1)), Some(on(0, 0)), Some(on(1, 2)), None];
        assert_eq!(peer_name(&routes, on(1, 2)), "rank 2");
        assert_eq!(peer_name(&routes, on(0, 1)), "rank 0 (endpoint 1)");
        assert_eq!(
            peer_name(&routes, on(0, 2)),
            "endpoint 2",
            "another module's"
        );
        assert_eq!(peer_name(&routes, on(0, 7)), "endpoint 7");
    }
}
