//! Tests of the sans-IO core: replies, `put` refusals and quotas, the
//! barrier, finalize and abort.

use super::*;

fn core(size: u32) -> ServerCore {
    ServerCore::new(size, "kvs_test").unwrap()
}

fn msg(line: &str) -> Message {
    Message::parse(line.as_bytes()).unwrap()
}

fn reply(action: Action) -> Message {
    match action {
        Action::Reply(m) => m,
        other => panic!("expected a reply, got {other:?}"),
    }
}

#[test]
fn rejects_bad_construction() {
    assert!(matches!(
        ServerCore::new(0, "k"),
        Err(ServerError::EmptyJob)
    ));
    assert!(matches!(
        ServerCore::new(1, "a b"),
        Err(ServerError::InvalidKvsname { .. })
    ));
    assert!(matches!(
        ServerCore::new(1, ""),
        Err(ServerError::InvalidKvsname { .. })
    ));
    let long = "k".repeat(KVSNAME_MAX);
    assert!(matches!(
        ServerCore::new(1, long),
        Err(ServerError::InvalidKvsname { .. })
    ));
}

#[test]
fn session_replies() {
    let mut c = core(4);
    let r = reply(c.handle(2, &msg("cmd=init pmi_version=1 pmi_subversion=2")));
    assert_eq!(
        r.to_line().unwrap(),
        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n"
    );
    let r = reply(c.handle(2, &msg("cmd=init pmi_version=2 pmi_subversion=0")));
    assert_eq!(r.get("rc"), Some("-1"));
    let r = reply(c.handle(2, &msg("cmd=get_maxes")));
    assert_eq!(
        r.to_line().unwrap(),
        "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024 rc=0\n"
    );
    assert_eq!(
        reply(c.handle(2, &msg("cmd=get_appnum"))).get("appnum"),
        Some("0")
    );
    assert_eq!(
        reply(c.handle(2, &msg("cmd=get_universe_size"))).get("size"),
        Some("4")
    );
    assert_eq!(
        reply(c.handle(2, &msg("cmd=get_my_kvsname"))).get("kvsname"),
        Some("kvs_test")
    );
}

#[test]
fn put_get_like_hydra() {
    let mut c = core(2);
    let r = reply(c.handle(
        0,
        &msg("cmd=put kvsname=kvs_test key=addr-0 value=udp://x:1"),
    ));
    assert_eq!(r.to_line().unwrap(), "cmd=put_result rc=0 msg=success\n");
    let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=addr-0")));
    assert_eq!(
        r.to_line().unwrap(),
        "cmd=get_result rc=0 msg=success value=udp://x:1\n"
    );
    let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=nonexistent")));
    assert_eq!(
        r.to_line().unwrap(),
        "cmd=get_result rc=-1 msg=key_nonexistent_not_found value=unknown\n"
    );
    let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=PMI_process_mapping")));
    assert_eq!(r.get("value"), Some("(vector,(0,1,2))"));
    c.set_process_mapping(ProcessMapping::from_nodes(&[0, 1]));
    let r = reply(c.handle(1, &msg("cmd=get kvsname=kvs_test key=PMI_process_mapping")));
    assert_eq!(r.get("value"), Some("(vector,(0,1,1),(1,1,1))"));
    let r = reply(c.handle(1, &msg("cmd=get kvsname=other key=addr-0")));
    assert_eq!(r.get("rc"), Some("-1"));
}

#[test]
fn put_refusals() {
    let mut c = core(1);
    let long_key = format!("cmd=put key={} value=v", "k".repeat(KEYLEN_MAX + 1));
    let long_value = format!("cmd=put key=k value={}", "v".repeat(VALLEN_MAX + 1));
    for (line, why) in [
        (
            "cmd=put kvsname=kvs_test key=PMI_process_mapping value=x",
            "reserved_key",
        ),
        ("cmd=put key=PMI_anything value=x", "reserved_key"),
        (long_key.as_str(), "key_too_long"),
        (long_value.as_str(), "value_too_long"),
        ("cmd=put key=k", "missing_key_or_value"),
        ("cmd=put key=k value=caf\u{e9}", "invalid_key_or_value"),
        ("cmd=put kvsname=nope key=k value=v", "unknown_kvsname"),
    ] {
        let r = reply(c.handle(0, &msg(line)));
        assert_eq!(
            (r.cmd(), r.get("rc"), r.get("msg")),
            ("put_result", Some("-1"), Some(why))
        );
    }
    // The exact limits are accepted.
    let key = "k".repeat(KEYLEN_MAX);
    let value = "v".repeat(VALLEN_MAX);
    let r = reply(c.handle(0, &msg(&format!("cmd=put key={key} value={value}"))));
    assert_eq!(r.get("rc"), Some("0"));
    // Nothing refused was stored.
    let r = reply(c.handle(0, &msg("cmd=get key=PMI_anything")));
    assert_eq!(r.get("rc"), Some("-1"));
}

#[test]
fn unknown_and_unsupported_commands_are_answered() {
    let mut c = core(1);
    let r = reply(c.handle(0, &msg("cmd=frobnicate x=1")));
    assert_eq!(
        r.to_line().unwrap(),
        "cmd=frobnicate_result rc=-1 msg=unknown_command\n"
    );
    let r = reply(c.handle(0, &msg("cmd=publish_name service=s port=p")));
    assert_eq!((r.cmd(), r.get("rc")), ("publish_result", Some("-1")));
    let spawn = Message::new("spawn").with("nprocs", "1").into_multiline();
    let r = reply(c.handle(0, &spawn));
    assert_eq!((r.cmd(), r.get("rc")), ("spawn_result", Some("-1")));
    // A command name that cannot be echoed closes the connection.
    assert!(matches!(
        c.handle(0, &msg("cmd=caf\u{e9}")),
        Action::Close { reply: None, .. }
    ));
    // And the session still works.
    assert_eq!(
        reply(c.handle(0, &msg("cmd=get_appnum"))).get("rc"),
        Some("0")
    );
}

#[test]
fn barrier_holds_until_all_arrive() {
    let mut c = core(3);
    let b = msg("cmd=barrier_in");
    for round in 1..=2 {
        assert_eq!(c.handle(2, &b), Action::ReplyLater);
        assert_eq!(c.handle(0, &b), Action::ReplyLater);
        assert_eq!(c.barrier_epoch(), round - 1);
        // A rank in the barrier may not enter it again.
        assert!(matches!(
            c.handle(0, &b),
            Action::Close { reply: Some(_), .. }
        ));
        match c.handle(1, &b) {
            Action::Release { ranks, reply } => {
                assert_eq!(ranks, vec![0, 1, 2]);
                assert_eq!(reply.to_line().unwrap(), "cmd=barrier_out rc=0\n");
            }
            other => panic!("expected a release, got {other:?}"),
        }
        assert_eq!(c.barrier_epoch(), round);
    }
    let mut single = core(1);
    assert!(matches!(single.handle(0, &b), Action::Release { ranks, .. } if ranks == [0]));
}

#[test]
fn finalize_abort_and_after() {
    let mut c = core(2);
    assert!(matches!(
        c.handle(1, &msg("cmd=abort exitcode=7 message=it_broke")),
        Action::Abort { rank: 1, code: 7, ref message } if message == "it_broke"
    ));
    assert!(matches!(
        c.handle(1, &msg("cmd=abort exitcode=x")),
        Action::Abort { code: 1, .. }
    ));
    match c.handle(0, &msg("cmd=finalize")) {
        Action::Finalized { reply } => {
            assert_eq!(reply.to_line().unwrap(), "cmd=finalize_ack rc=0\n");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.handle(0, &msg("cmd=get_appnum")),
        Action::Close { .. }
    ));
    assert!(matches!(
        c.handle(9, &msg("cmd=get_appnum")),
        Action::Close { reply: None, .. }
    ));
}

#[test]
fn kvs_quota_per_rank() {
    let mut c = core(2);
    c.set_kvs_limits(KvsLimits { bytes: 40, keys: 3 });
    let put = |c: &mut ServerCore, rank: u32, key: &str, value: &str| {
        c.handle(rank, &msg(&format!("cmd=put key={key} value={value}")))
    };
    let ok = |a: Action| assert_eq!(reply(a).get("rc"), Some("0"));
    // Rank 0: three keys of 2 + 8 bytes.
    for key in ["k0", "k1", "k2"] {
        ok(put(&mut c, 0, key, "12345678"));
    }
    // Replacing its own key does not count twice.
    ok(put(&mut c, 0, "k2", "1234567890"));
    // A fourth key is over the key count: refused and closed.
    match put(&mut c, 0, "k3", "v") {
        Action::Close {
            reply: Some(reply),
            detail,
        } => {
            assert_eq!(
                reply.to_line().unwrap(),
                "cmd=put_result rc=-1 msg=kvs_quota_exceeded\n"
            );
            assert!(
                detail.contains("rank 0") && detail.contains("quota"),
                "{detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        reply(c.handle(1, &msg("cmd=get key=k3"))).get("rc"),
        Some("-1")
    );
    // Rank 1 has its own quota, in bytes: 2 + 30 fits, 9 more do not.
    ok(put(&mut c, 1, "m0", &"v".repeat(30)));
    assert!(matches!(
        put(&mut c, 1, "m1", "1234567"),
        Action::Close { .. }
    ));
    // Taking over rank 0's key moves it to rank 1's account, which is
    // full; rank 0's then has room again.
    ok(put(&mut c, 1, "m0", "v"));
    ok(put(&mut c, 1, "k0", "v"));
    ok(put(&mut c, 0, "k3", "v"));
    assert_eq!(
        reply(c.handle(0, &msg("cmd=get key=k0"))).get("value"),
        Some("v")
    );
}

#[test]
fn malformed_line_closes_with_error_reply() {
    let mut c = core(1);
    let err = Message::parse(b"cmd=put key").unwrap_err();
    match c.handle_malformed(Some(0), &err) {
        Action::Close {
            reply: Some(reply),
            detail,
        } => {
            assert_eq!(reply.get("rc"), Some("-1"));
            assert!(detail.contains("rank 0"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}
