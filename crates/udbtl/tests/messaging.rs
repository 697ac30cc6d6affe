//! The program's side of messaging, on a job of one (a rank can send to
//! itself): blocking and polling receives, messages kept until asked for,
//! callbacks that take a tag over, and the errors of each.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use udbtl::{Message, RecvError, SendError, Tag};

const FIRST: Tag = Tag::new(0);
const SECOND: Tag = Tag::new(Tag::MAX);

#[test]
fn receives_keep_each_tags_messages_in_order_until_asked_for() {
    let mut world = udbtl::init().unwrap();
    let long = vec![7u8; 200 * 1024];
    world.send(0, FIRST, b"one").unwrap();
    world.send(0, SECOND, b"other tag").unwrap();
    world.send(0, FIRST, &long).unwrap();
    world.send(0, FIRST, b"").unwrap();
    // Sent from the buffer itself: the same message, and the buffer given
    // back once acknowledged (finalize waits for that).
    let shared: Arc<[u8]> = (0..300 * 1024).map(|i| (i % 253) as u8).collect();
    world.send_shared(0, FIRST, &shared).unwrap();
    world
        .send_shared(0, FIRST, &Arc::from(&b"short"[..]))
        .unwrap();

    // Nothing is lost while nobody asks, and tags do not mix.
    let message = world.recv(FIRST).unwrap();
    assert_eq!(
        message,
        Message {
            from: Some(0),
            tag: FIRST,
            data: b"one".to_vec()
        }
    );
    assert_eq!(world.recv(FIRST).unwrap().data, long);
    assert_eq!(world.recv(FIRST).unwrap().data, b"");
    assert!(world.recv(FIRST).unwrap().data == shared[..]);
    assert_eq!(world.recv(FIRST).unwrap().data, b"short");
    assert_eq!(world.try_recv(FIRST).unwrap(), None);

    // A callback installed later gets what was kept for its tag at once,
    // and takes the tag over: a receive on it is refused, not left waiting.
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    world.on_receive(SECOND, move |from, bytes| {
        sink.lock().unwrap().push((from, bytes.to_vec()))
    });
    assert_eq!(*got.lock().unwrap(), [(Some(0), b"other tag".to_vec())]);
    assert!(matches!(
        world.recv(SECOND),
        Err(RecvError::HasCallback { tag: SECOND })
    ));
    world.send(0, SECOND, b"later").unwrap();
    while got.lock().unwrap().len() < 2 {
        world.progress();
    }
    assert_eq!(got.lock().unwrap()[1], (Some(0), b"later".to_vec()));

    // Sends name what is wrong.
    let err = world.send(1, FIRST, b"x").unwrap_err();
    assert!(matches!(err, SendError::Connect(_)), "{err:?}");
    assert_eq!(err.to_string(), "rank 1 is outside a job of 1");
    let err = world.send_bytes(0, FIRST, &long).unwrap_err();
    assert!(
        matches!(
            err,
            SendError::TooLong {
                rank: 0,
                len: 204_800,
                ..
            }
        ),
        "{err:?}"
    );
    world.finalize().unwrap();
    assert_eq!(Arc::strong_count(&shared), 1, "the transport let go of it");
}
