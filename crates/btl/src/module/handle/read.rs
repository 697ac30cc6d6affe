//! Remote reads as a host asks for them (`read/` has the protocol): the
//! regions peers may read, and reads of theirs.

use udbtl_fabric::Context;

use super::Module;
use crate::EndpointId;
use crate::error::BtlError;
use crate::module::{ReadCallback, ReadTarget, Region, RegionKey, RemoteRange};

impl<C: Context> Module<C> {
    /// Lets this module's peers read `region` (see [`Region`] for how long
    /// its bytes must stay put), and returns the key they name it by. The
    /// key is drawn at random per module, then counts up; it is never 0.
    pub fn register_region(&self, region: Region) -> RegionKey {
        self.lock().register_region(region)
    }

    /// Stops serving reads of a region. Returns `false` if the key names
    /// none. Replies already sent from it may still be resent until they
    /// are acknowledged ([`Region`]).
    pub fn deregister_region(&self, key: RegionKey) -> bool {
        self.lock().deregister_region(key)
    }

    /// Reads `target`'s length in bytes from `endpoint`'s memory at `from`
    /// into `target`, over the reliable stream: one small request, then one
    /// reply the peer sends straight from its registered memory, which is
    /// copied into `target` datagram by datagram as it arrives. The peer
    /// must be progressing. The outcome comes as a
    /// [`HostEvent::ReadDone`](crate::HostEvent::ReadDone) carrying
    /// `context` (to the read callback, under [`progress`](Self::progress)),
    /// exactly once for every read this call accepted: complete, refused by
    /// the peer, or failed with its lost peer.
    ///
    /// At most 32 reads are out at a time; the others wait their turn in
    /// the module, so a host may ask for many at once.
    ///
    /// # Errors
    /// An unreliable module, a read longer than
    /// [`Limits::read_limit`](crate::Limits::read_limit), or an unknown
    /// endpoint.
    pub fn read(
        &self,
        endpoint: EndpointId,
        mut target: Box<dyn ReadTarget>,
        from: RemoteRange,
        context: u64,
    ) -> Result<(), BtlError> {
        let len = target.bytes_mut().len();
        self.lock().start_read(endpoint, target, len, from, context)
    }

    /// Installs the callback that reports finished reads.
    pub fn set_read_callback(&mut self, callback: ReadCallback) {
        self.callbacks.get_mut().read = Some(callback);
    }
}
