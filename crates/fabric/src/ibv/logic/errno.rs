//! Errno to [`FabricError`]: [`Verb`] names what was being done,
//! [`errno_error`] maps the errno of any verb, [`post_errno_error`] that of
//! a post.

use std::io;

use crate::FabricError;

/// What was being done when verbs returned an errno, for [`errno_error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `ibv_open_device`.
    OpenDevice,
    /// `ibv_query_device`, `ibv_query_port`, `ibv_query_gid`, ...
    Query,
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_create_cq` or `ibv_resize_cq`.
    CreateCq,
    /// `ibv_create_qp`.
    CreateQp,
    /// `ibv_modify_qp`.
    ModifyQp,
    /// `ibv_create_ah`.
    CreateAh,
    /// `ibv_poll_cq`.
    PollCq,
    /// `ibv_destroy_*`, `ibv_dereg_mr`, `ibv_dealloc_pd`,
    /// `ibv_close_device`.
    Destroy,
}

impl Verb {
    /// The verbs function's name.
    pub const fn operation(self) -> &'static str {
        match self {
            Self::OpenDevice => "ibv_open_device",
            Self::Query => "ibv_query",
            Self::AllocPd => "ibv_alloc_pd",
            Self::RegMr => "ibv_reg_mr",
            Self::CreateCq => "ibv_create_cq",
            Self::CreateQp => "ibv_create_qp",
            Self::ModifyQp => "ibv_modify_qp",
            Self::CreateAh => "ibv_create_ah",
            Self::PollCq => "ibv_poll_cq",
            Self::Destroy => "ibv_destroy",
        }
    }

    /// The resource a creation makes, for [`FabricError::ResourceExhausted`].
    const fn resource(self) -> &'static str {
        match self {
            Self::AllocPd => "protection domains",
            Self::RegMr => "memory registrations",
            Self::CreateCq => "completion queues",
            Self::CreateQp => "queue pairs",
            Self::CreateAh => "address handles",
            _ => "device memory",
        }
    }
}

/// Maps the errno of a failed verb (other than a post) to a
/// [`FabricError`].
///
/// * `ENOMEM`, `ENOSPC`, `EAGAIN` while creating: the device is out of
///   that resource ([`FabricError::ResourceExhausted`], limit 0: verbs does
///   not say which limit was hit).
/// * `EINVAL`, `EOPNOTSUPP`, `ERANGE`: an attribute the device refuses
///   ([`FabricError::InvalidArgument`]).
/// * `ENODEV`, `ENXIO`, `EIO` on an opened device: the device is gone
///   ([`FabricError::DeviceLost`]).
/// * `EBUSY` on destroy: dependants remain ([`FabricError::Busy`]).
/// * Anything else: [`FabricError::Io`] with the OS error.
pub fn errno_error(verb: Verb, errno: i32, device: &str) -> FabricError {
    let creating = matches!(
        verb,
        Verb::AllocPd | Verb::RegMr | Verb::CreateCq | Verb::CreateQp | Verb::CreateAh
    );
    match errno {
        libc::ENOMEM | libc::ENOSPC | libc::EAGAIN if creating => FabricError::ResourceExhausted {
            what: verb.resource(),
            limit: 0,
        },
        libc::EINVAL | libc::EOPNOTSUPP | libc::ERANGE => FabricError::InvalidArgument {
            what: verb.operation(),
            detail: io::Error::from_raw_os_error(errno).to_string(),
        },
        libc::ENODEV | libc::ENXIO | libc::EIO => FabricError::DeviceLost {
            device: device.to_owned(),
            reason: format!(
                "{}: {}",
                verb.operation(),
                io::Error::from_raw_os_error(errno)
            ),
        },
        libc::EBUSY if verb == Verb::Destroy => FabricError::Busy {
            kind: "verbs object",
            users: 1,
            user_kind: "dependent objects",
        },
        _ => FabricError::Io {
            operation: verb.operation(),
            source: io::Error::from_raw_os_error(errno),
        },
    }
}

/// Maps the errno of a refused `ibv_post_send`/`ibv_post_recv`: `ENOMEM`
/// and `EAGAIN` mean the work queue is full
/// ([`FabricError::QueueFull`] with the queue's capacity), `EINVAL` a bad
/// request, anything else as [`errno_error`].
pub fn post_errno_error(
    errno: i32,
    queue: &'static str,
    capacity: usize,
    device: &str,
) -> FabricError {
    match errno {
        libc::ENOMEM | libc::EAGAIN => FabricError::QueueFull { queue, capacity },
        libc::EINVAL => FabricError::InvalidArgument {
            what: "work request",
            detail: format!("{queue}: {}", io::Error::from_raw_os_error(errno)),
        },
        _ => errno_error(Verb::Query, errno, device),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_fabric_errors() {
        let dev = "mlx5_0";
        assert!(matches!(
            errno_error(Verb::CreateQp, libc::ENOMEM, dev),
            FabricError::ResourceExhausted {
                what: "queue pairs",
                ..
            }
        ));
        assert!(matches!(
            errno_error(Verb::CreateCq, libc::EAGAIN, dev),
            FabricError::ResourceExhausted {
                what: "completion queues",
                ..
            }
        ));
        assert!(matches!(
            errno_error(Verb::ModifyQp, libc::EINVAL, dev),
            FabricError::InvalidArgument {
                what: "ibv_modify_qp",
                ..
            }
        ));
        match errno_error(Verb::Query, libc::ENODEV, dev) {
            FabricError::DeviceLost { device, reason } => {
                assert_eq!(device, dev);
                assert!(reason.starts_with("ibv_query"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            errno_error(Verb::Destroy, libc::EBUSY, dev),
            FabricError::Busy { .. }
        ));
        match errno_error(Verb::Query, libc::EACCES, dev) {
            FabricError::Io { operation, source } => {
                assert_eq!(operation, "ibv_query");
                assert_eq!(source.raw_os_error(), Some(libc::EACCES));
            }
            other => panic!("{other:?}"),
        }
        // ENOMEM outside a creation is a plain OS error.
        assert!(matches!(
            errno_error(Verb::Query, libc::ENOMEM, dev),
            FabricError::Io { .. }
        ));
    }

    #[test]
    fn post_errnos_mean_a_full_queue() {
        for errno in [libc::ENOMEM, libc::EAGAIN] {
            assert!(matches!(
                post_errno_error(errno, "send queue", 64, "d"),
                FabricError::QueueFull {
                    queue: "send queue",
                    capacity: 64
                }
            ));
        }
        assert!(matches!(
            post_errno_error(libc::EINVAL, "receive queue", 8, "d"),
            FabricError::InvalidArgument { .. }
        ));
        assert!(matches!(
            post_errno_error(libc::ENODEV, "receive queue", 8, "d"),
            FabricError::DeviceLost { .. }
        ));
    }
}
