//! The client against scripted servers that replay the exact hydra 4.0.2 and
//! Slurm (pmi2 plugin, PMI-1 wire) transcripts recorded on the probe machine
//! (machine-notes.md §5), byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use udbtl_pmi::{Maxes, Mode, PmiClient, PmiError, WireError};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One request line the client must send, and the reply lines to answer.
type Step = (&'static str, &'static [&'static str]);

/// Plays `steps` on the server side of a stream: asserts each request line,
/// writes the replies, and at the end asserts that the client sent nothing
/// more before closing.
fn play<S: Read + Write>(mut reader: BufReader<S>, steps: &[Step]) {
    play_steps(&mut reader, steps);
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "unexpected requests after the script");
}

/// Plays `steps` on the server side of a stream, and no more.
fn play_steps<S: Read + Write>(reader: &mut BufReader<S>, steps: &[Step]) {
    for (i, (request, replies)) in steps.iter().enumerate() {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert_eq!(line, format!("{request}\n"), "step {i}");
        for reply in *replies {
            reader
                .get_mut()
                .write_all(format!("{reply}\n").as_bytes())
                .unwrap();
        }
    }
}

/// A client on one end of a socketpair whose other end plays `steps`.
fn scripted(steps: &[Step], rank: u32, size: u32) -> (PmiClient, JoinHandle<()>) {
    let steps = steps.to_vec();
    let (ours, theirs) = UnixStream::pair().unwrap();
    ours.set_read_timeout(Some(TIMEOUT)).unwrap();
    theirs.set_read_timeout(Some(TIMEOUT)).unwrap();
    let server = thread::spawn(move || play(BufReader::new(theirs), &steps));
    let reader = BufReader::new(ours.try_clone().unwrap());
    (PmiClient::new(reader, ours, rank, size).unwrap(), server)
}

const HYDRA_KVS: &str = "kvs_12593_0_296824150_vm";

const HYDRA_INIT: &[Step] = &[
    (
        "cmd=init pmi_version=1 pmi_subversion=1",
        &["cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"],
    ),
    (
        "cmd=get_maxes",
        &["cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024"],
    ),
    ("cmd=get_appnum", &["cmd=appnum appnum=0"]),
    (
        "cmd=get_my_kvsname",
        &["cmd=my_kvsname kvsname=kvs_12593_0_296824150_vm"],
    ),
    ("cmd=get_universe_size", &["cmd=universe_size size=-1"]),
];

const HYDRA_SESSION: &[Step] = &[
    HYDRA_INIT[0],
    HYDRA_INIT[1],
    HYDRA_INIT[2],
    HYDRA_INIT[3],
    HYDRA_INIT[4],
    (
        "cmd=put kvsname=kvs_12593_0_296824150_vm key=addr-0 value=udp://127.0.0.1:50000",
        &["cmd=put_result rc=0 msg=success"],
    ),
    ("cmd=barrier_in", &["cmd=barrier_out"]),
    (
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=addr-1",
        &["cmd=get_result rc=0 msg=success value=udp://127.0.0.1:50001"],
    ),
    (
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=nonexistent",
        &["cmd=get_result rc=-1 msg=key_nonexistent_not_found value=unknown"],
    ),
    (
        "cmd=get kvsname=kvs_12593_0_296824150_vm key=PMI_process_mapping",
        &["cmd=get_result rc=0 msg=success value=(vector,(0,1,1))"],
    ),
    ("cmd=finalize", &["cmd=finalize_ack"]),
];

const SLURM_SESSION: &[Step] = &[
    (
        "cmd=init pmi_version=1 pmi_subversion=1",
        &["cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1"],
    ),
    (
        "cmd=get_maxes",
        &["cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024"],
    ),
    ("cmd=get_appnum", &["cmd=appnum rc=0 appnum=-1"]),
    ("cmd=get_my_kvsname", &["cmd=my_kvsname rc=0 kvsname=2.0"]),
    ("cmd=get_universe_size", &["cmd=universe_size rc=0 size=2"]),
    (
        "cmd=put kvsname=2.0 key=addr-1 value=udp://127.0.0.1:50001",
        &["cmd=put_result rc=0"],
    ),
    ("cmd=barrier_in", &["cmd=barrier_out rc=0"]),
    (
        "cmd=get kvsname=2.0 key=addr-0",
        &["cmd=get_result rc=0 value=udp://127.0.0.1:50000"],
    ),
    (
        "cmd=get kvsname=2.0 key=nonexistent",
        &["cmd=get_result rc=1"],
    ),
    (
        "cmd=get kvsname=2.0 key=PMI_process_mapping",
        &["cmd=get_result rc=0 value=(vector,(0,1,2))"],
    ),
    ("cmd=finalize", &["cmd=finalize_ack rc=0"]),
];

/// HYDRA_INIT followed by `extra`.
fn after_init(extra: &[Step]) -> Vec<Step> {
    let mut steps = HYDRA_INIT.to_vec();
    steps.extend_from_slice(extra);
    steps
}

mod barrier;
mod recorded;
