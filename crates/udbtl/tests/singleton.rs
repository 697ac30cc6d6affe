//! A program started without a launcher is rank 0 of a job of one, with a
//! working transport (it can reach itself).

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use udbtl::Tag;

#[test]
fn singleton_init_reaches_itself_and_finalizes() {
    for var in ["PMI_FD", "PMI_PORT", "PMI_RANK", "PMI_SIZE", "PMIX_RANK"] {
        assert!(
            std::env::var_os(var).is_none(),
            "{var} is set in the test environment"
        );
    }
    let mut world = udbtl::init().unwrap();
    assert_eq!((world.rank(), world.size()), (0, 1));
    type Inbox = Arc<Mutex<Vec<(Option<u32>, Vec<u8>)>>>;
    let got: Inbox = Arc::default();
    let sink = got.clone();
    world.on_receive(Tag::new(0), move |from, bytes| {
        sink.lock().unwrap().push((from, bytes.to_vec()))
    });
    world.send_bytes(0, Tag::new(0), b"note to self").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.lock().unwrap().is_empty() && Instant::now() < deadline {
        world.progress();
    }
    assert_eq!(*got.lock().unwrap(), [(Some(0), b"note to self".to_vec())]);
    assert!(matches!(
        world.connect(1),
        Err(udbtl::InitError::NoSuchRank { rank: 1, size: 1 })
    ));
    world.finalize().unwrap();
}
