//! A stranger on the host sends datagrams to a job's udbtl sockets with the
//! job's keys, while two ranks exchange checked messages
//! (`programs/stranger_exchange.c`): no forged datagram may crash a rank,
//! end the job, or reach a message.
//!
//! * Tag 255 is one past Open MPI's table of receive callbacks
//!   (`MCA_BTL_TAG_MAX` entries): such a datagram must be counted and
//!   dropped, not call whatever lies past the table. The job runs
//!   unreliable (`btl_udbtl_reliable 0`), where a datagram with the right
//!   job key and queue key reaches the callbacks from any sender.
//! * Resets and acknowledgements, reliable and checksummed, from each
//!   rank's own address and port to the other's (a raw socket, so root
//!   only: ignored otherwise, `SKIPPED: ...`), at the sequence numbers every stream used to
//!   start from: each must be counted and dropped (RFC 5961), where the
//!   first reset used to end the job.
//!
//! Both run with the seed's fixed Q_Key (`btl_udbtl_ib_qkey`), which also
//! leaves the job key unmasked: the stranger knows the module's admission,
//! as only a process that read the modex could, and the test reaches the
//! checks behind it. At the defaults these datagrams die in the fabric
//! (`crates/testbins/tests/forgery.rs` shows it under udrun).

mod common;

#[path = "../../../tests/support/forger.rs"]
mod forger;
#[path = "../../../tests/support/proc_net.rs"]
mod proc_net;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Output, Stdio};

use common::Run;
use forger::Spoofer;
use udbtl_wire::btl;

const JOB_KEY: u32 = 24_301;
const FORGED_PER_SOCKET: usize = 20;

/// A datagram as udbtl's UDP provider carries it: UD header, BTL header
/// (unreliable) with `tag`, and a few bytes of payload.
fn forged(tag: u8) -> Vec<u8> {
    let mut bytes = forger::ud_header().to_vec();
    let mut head = [0u8; btl::HEADER_LEN];
    btl::Repr {
        tag,
        job_key: JOB_KEY,
        reliable: false,
    }
    .emit(&mut btl::Packet::new_unchecked(&mut head[..]));
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(b"forged by a stranger");
    bytes
}

/// Runs `stranger_exchange` with `run`'s settings and the test's job key;
/// once both ranks are up, `stranger` gets each rank's process id and
/// sockets and sends what it forges. Returns the job's output after
/// checking it succeeded and every message was right.
fn exchange_with_a_stranger(
    run: Run,
    stranger: impl FnOnce(&[(u32, Vec<std::net::SocketAddrV4>)]),
) -> Output {
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "udbtl-forged-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test folder");
    let exe = common::program("stranger_exchange");
    let run = run
        .mca("btl_udbtl_job_key", &JOB_KEY.to_string())
        .mca("btl_udbtl_ib_qkey", &forger::QKEY.to_string());
    let _turn = common::serial();
    let mut child = run
        .command(&exe, &[dir.to_str().expect("a UTF-8 temporary folder")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpirun");
    let pids = forger::rank_pids(&dir, 2, || {
        child.try_wait().expect("wait for mpirun").is_some()
    });
    if let Some(pids) = pids {
        let ranks: Vec<(u32, Vec<_>)> = pids
            .iter()
            .zip(0..)
            .map(|(pid, rank)| (rank, proc_net::sockets(*pid, "udp", None)))
            .collect();
        stranger(&ranks);
    }
    std::fs::write(dir.join("done"), b"").expect("say the stranger is done");
    let out = child.wait_with_output().expect("wait for mpirun");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the job failed ({}):\n{stderr}",
        out.status
    );
    common::assert_said_ok("stranger_exchange", &out, "a stranger's datagrams");
    out
}

#[test]
#[cfg_attr(
    udbtl_missing = "openmpi",
    ignore = "SKIPPED: needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
)]
fn a_datagram_with_tag_255_is_counted_and_dropped() {
    require_openmpi!();
    let mut sockets = 0;
    let out = exchange_with_a_stranger(Run::udbtl(2).mca("btl_udbtl_reliable", "0"), |ranks| {
        let stranger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the stranger");
        let datagram = forged(255);
        for to in ranks.iter().flat_map(|(_, sockets)| sockets) {
            sockets += 1;
            for _ in 0..FORGED_PER_SOCKET {
                let to = SocketAddr::from((Ipv4Addr::LOCALHOST, to.port()));
                stranger
                    .send_to(&datagram, to)
                    .expect("send a forged datagram");
            }
        }
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        sockets >= 2,
        "the ranks hold no UDP socket to send to:\n{stderr}"
    );
    let dropped = common::total(&out, "no_callback");
    println!("{sockets} sockets, {FORGED_PER_SOCKET} forged datagrams each: {dropped} counted");
    assert!(
        dropped > 0,
        "no forged datagram was counted as having no callback:\n{stderr}"
    );
}

#[test]
#[cfg_attr(
    any(udbtl_missing = "openmpi", udbtl_missing = "root"),
    ignore = "SKIPPED: needs Open MPI and root (a raw socket)"
)]
fn forged_resets_and_acknowledgements_are_counted_and_dropped() {
    require_openmpi!();
    let spoofer = match Spoofer::open() {
        Ok(spoofer) => spoofer,
        Err(reason) => {
            udbtl_prereq::skipped!("{reason}");
            return;
        }
    };
    let mut forged = None;
    let out = exchange_with_a_stranger(Run::udbtl(2), |ranks| {
        forged = Some(
            forger::forge_resets_and_acks(&spoofer, JOB_KEY, ranks)
                .expect("send a forged datagram"),
        );
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    let forged = forged.expect("both ranks started");
    let counted = common::total(&out, "unacceptable");
    println!(
        "{} resets and {} acknowledgements forged: {counted} counted as unacceptable",
        forged.resets, forged.acks
    );
    assert!(
        forged.resets > 0 && counted > 0,
        "no forged datagram was counted as unacceptable:\n{stderr}"
    );
}
