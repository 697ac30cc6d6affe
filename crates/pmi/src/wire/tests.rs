//! Unit tests of the PMI-1 wire format: parsing, emission and the
//! multi-line `spawn` form.

use std::io::Cursor;

use proptest::prelude::*;

use super::*;

static HYDRA_GET_MISSING: &[u8] =
    b"cmd=get_result rc=-1 msg=key_nonexistent_not_found value=unknown\n";
static SLURM_INIT: &[u8] = b"cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n";
static SPAWN: &[u8] =
    b"mcmd=spawn\nnprocs=2\nexecname=/bin/true\narg1=a b\npreput_num=0\nendcmd\ncmd=finalize\n";

fn read_all(bytes: &[u8]) -> Vec<Result<Message, String>> {
    let mut cur = Cursor::new(bytes);
    let mut out = Vec::new();
    loop {
        match read_message(&mut cur) {
            Ok(Some(m)) => out.push(Ok(m)),
            Ok(None) => return out,
            Err(e) => {
                out.push(Err(e.to_string()));
                return out;
            }
        }
    }
}

#[test]
fn parse_hydra_missing_key_reply() {
    let m = Message::parse(HYDRA_GET_MISSING).unwrap();
    assert_eq!(m.cmd(), "get_result");
    assert_eq!(m.get("rc"), Some("-1"));
    assert_eq!(m.get("msg"), Some("key_nonexistent_not_found"));
    assert_eq!(m.get("value"), Some("unknown"));
    assert_eq!(m.get("found"), None);
    assert_eq!(m.args().len(), 3);
    assert!(!m.is_multiline());
}

#[test]
fn key_order_does_not_matter() {
    let slurm = Message::parse(SLURM_INIT).unwrap();
    let hydra =
        Message::parse(b"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n").unwrap();
    for key in ["rc", "pmi_version", "pmi_subversion"] {
        assert_eq!(slurm.get(key), hydra.get(key), "{key}");
    }
    assert_ne!(slurm, hydra, "wire order is kept in args()");
}

#[test]
fn value_is_everything_after_first_eq() {
    let m = Message::parse(b"cmd=x a==b= empty= mapping=(vector,(0,1,2))").unwrap();
    assert_eq!(m.get("a"), Some("=b="));
    assert_eq!(m.get("empty"), Some(""));
    assert_eq!(m.get("mapping"), Some("(vector,(0,1,2))"));
}

#[test]
fn spaces_and_crlf_tolerated() {
    let m = Message::parse(b"  cmd=barrier_out   rc=0  \r\n").unwrap();
    assert_eq!(m, Message::new("barrier_out").with("rc", "0"));
}

#[test]
fn rejects_malformed_lines() {
    type Check = fn(&WireError) -> bool;
    let cases: &[(&[u8], Check)] = &[
        (b"\n", |e| matches!(e, WireError::MissingCmd { .. })),
        (b"key=v cmd=x\n", |e| {
            matches!(e, WireError::MissingCmd { .. })
        }),
        (b"cmd=\n", |e| matches!(e, WireError::MissingCmd { .. })),
        (b"mcmd=spawn\n", |e| {
            matches!(e, WireError::MissingCmd { .. })
        }),
        (b"cmd\n", |e| matches!(e, WireError::TokenWithoutEq { .. })),
        (b"cmd=get key\n", |e| {
            matches!(e, WireError::TokenWithoutEq { .. })
        }),
        (b"cmd=get =v\n", |e| matches!(e, WireError::EmptyKey { .. })),
        (b"cmd=get key=\xff\n", |e| {
            matches!(e, WireError::NotUtf8 { valid_up_to: 12 })
        }),
    ];
    for (line, check) in cases {
        let err = Message::parse(line).unwrap_err();
        assert!(
            check(&err),
            "{:?} -> {err:?}",
            String::from_utf8_lossy(line)
        );
    }
}

#[test]
fn emit_fixture_and_validation() {
    let m = Message::new("get_result")
        .with("rc", "0")
        .with("msg", "success")
        .with("value", "");
    assert_eq!(
        m.to_line().unwrap(),
        "cmd=get_result rc=0 msg=success value=\n"
    );
    let bad_value = Message::new("put").with("value", "a b");
    assert_eq!(
        bad_value.to_line(),
        Err(WireError::InvalidValue {
            key: "value".into()
        })
    );
    assert!(matches!(
        Message::new("put").with("k=", "v").to_line(),
        Err(WireError::InvalidKey { .. })
    ));
    assert!(matches!(
        Message::new("").to_line(),
        Err(WireError::InvalidKey { .. })
    ));
    assert!(matches!(
        Message::new("put").with("k", "caf\u{e9}").to_line(),
        Err(WireError::InvalidValue { .. })
    ));
    assert!(matches!(
        Message::new("put").with("k", "a\nb").to_line(),
        Err(WireError::InvalidValue { .. })
    ));
}

#[test]
fn reads_multiline_spawn_then_next_command() {
    let got = read_all(SPAWN);
    assert_eq!(got.len(), 2, "{got:?}");
    let spawn = got[0].as_ref().unwrap();
    assert!(spawn.is_multiline());
    assert_eq!(spawn.cmd(), "spawn");
    assert_eq!(spawn.get("nprocs"), Some("2"));
    assert_eq!(
        spawn.get("arg1"),
        Some("a b"),
        "a multi-line value runs to end of line"
    );
    assert_eq!(got[1].as_ref().unwrap(), &Message::new("finalize"));
}

#[test]
fn multiline_emit_round_trips() {
    let m = Message::new("spawn")
        .with("nprocs", "1")
        .with("execname", "x")
        .into_multiline();
    let line = m.to_line().unwrap();
    assert_eq!(line, "mcmd=spawn\nnprocs=1\nexecname=x\nendcmd\n");
    assert_eq!(read_all(line.as_bytes()), vec![Ok(m)]);
}

#[test]
fn truncated_and_oversized_input() {
    assert_eq!(
        read_all(b"cmd=init pmi_version=1"),
        vec![Err("PMI stream ended inside a message".into())]
    );
    assert_eq!(
        read_all(b"mcmd=spawn\nnprocs=1\n"),
        vec![Err("PMI stream ended inside a message".into())]
    );
    assert!(read_all(b"").is_empty());

    let mut long = b"cmd=put value=".to_vec();
    long.resize(MAX_LINE + 10, b'x');
    long.push(b'\n');
    let mut cur = Cursor::new(&long[..]);
    assert!(matches!(
        read_message(&mut cur),
        Err(ReadError::Malformed(WireError::LineTooLong {
            max: MAX_LINE
        }))
    ));
    assert!(cur.position() <= MAX_LINE as u64 + 1, "read past the limit");

    let mut exact = b"cmd=put value=".to_vec();
    exact.resize(MAX_LINE, b'x');
    exact.push(b'\n');
    let m = read_message(&mut Cursor::new(&exact[..])).unwrap().unwrap();
    assert_eq!(m.get("value").map(str::len), Some(MAX_LINE - 14));

    let mut many = b"mcmd=spawn\n".to_vec();
    while many.len() <= MAX_LINE {
        many.extend_from_slice(b"key=value\n");
    }
    many.extend_from_slice(b"endcmd\n");
    assert!(matches!(
        read_message(&mut Cursor::new(&many[..])),
        Err(ReadError::Malformed(WireError::LineTooLong { .. }))
    ));
}

#[test]
fn snippet_truncates_on_char_boundary() {
    let s = "\u{e9}".repeat(100);
    let t = snippet(&s);
    assert!(t.ends_with("..."));
    assert_eq!(t.chars().count(), SNIPPET + 3);
}

fn key() -> impl Strategy<Value = String> {
    "[!-<>-~]{1,16}"
}

fn value() -> impl Strategy<Value = String> {
    "[!-~]{0,40}"
}

fn message() -> impl Strategy<Value = Message> {
    (
        key(),
        prop::collection::vec((key(), value()), 0..8),
        any::<bool>(),
    )
        .prop_map(|(cmd, args, multiline)| {
            let mut m = Message::new(cmd);
            for (k, v) in args {
                m.push(k, v);
            }
            if multiline { m.into_multiline() } else { m }
        })
}

proptest! {
    #[test]
    fn emit_then_parse_is_identity(m in message()) {
        let line = m.to_line().unwrap();
        let mut cur = Cursor::new(line.as_bytes());
        prop_assert_eq!(read_message(&mut cur).unwrap(), Some(m.clone()));
        prop_assert_eq!(read_message(&mut cur).unwrap(), None);
        if !m.is_multiline() {
            prop_assert_eq!(Message::parse(line.as_bytes()).unwrap(), m);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Message::parse(&bytes);
        let mut cur = Cursor::new(&bytes[..]);
        for _ in 0..bytes.len() + 1 {
            match read_message(&mut cur) {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }

    #[test]
    fn arbitrary_lines_never_panic(line in "(c?md=)?[ -~=\\n]{0,200}") {
        if let Ok(m) = Message::parse(line.as_bytes()) {
            // Whatever parsed keeps a non-empty command and keys.
            prop_assert!(!m.cmd().is_empty());
            prop_assert!(m.args().iter().all(|(k, _)| !k.is_empty()));
        }
        let _ = read_message(&mut Cursor::new(line.as_bytes()));
    }
}
