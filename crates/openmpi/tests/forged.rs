//! A stranger on the host sends datagrams to a job's udbtl sockets with the
//! job's keys. Tag 255 is one past Open MPI's table of receive callbacks
//! (`MCA_BTL_TAG_MAX` entries): such a datagram must be counted and
//! dropped, not call whatever lies past the table.
//!
//! The job runs unreliable (`btl_udbtl_reliable 0`), where a datagram with
//! the right job key and queue key reaches the callbacks from any sender,
//! and with a job key the test sets, so the stranger needs nothing else.
//! (With reliability on it would also need a peer's address and sequence
//! numbers.)

mod common;

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::Run;
use udbtl_wire::{btl, ud};

const JOB_KEY: u32 = 24_301;
/// The default `ib_qkey`, which every queue pair checks.
const QKEY: u32 = 0x0133_0133;
const FORGED_PER_SOCKET: usize = 20;

/// The process ids the ranks wrote into `dir`, once both have.
fn rank_pids(dir: &Path, child: &mut std::process::Child) -> Vec<u32> {
    loop {
        let pids: Vec<u32> = (0..2)
            .filter_map(|rank| std::fs::read_to_string(dir.join(format!("pid.{rank}"))).ok())
            .filter_map(|text| text.trim().parse().ok())
            .collect();
        if pids.len() == 2 {
            return pids;
        }
        if let Some(status) = child.try_wait().expect("wait for mpirun") {
            panic!("mpirun ended ({status}) before both ranks wrote their pid");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The local ports of the IPv4 UDP sockets process `pid` holds.
fn udp_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    Some(
                        target
                            .strip_prefix("socket:[")?
                            .strip_suffix(']')?
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let port = cols.get(1)?.rsplit(':').next()?;
            let inode = cols.get(9)?;
            inodes
                .iter()
                .any(|i| i == inode)
                .then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

/// A datagram as udbtl's UDP provider carries it: UD header, BTL header
/// (unreliable) with `tag`, and a few bytes of payload.
fn forged(tag: u8) -> Vec<u8> {
    let mut bytes = ud::Repr {
        pkey: 0xffff,
        qkey: QKEY,
        imm: None,
    }
    .to_bytes()
    .to_vec();
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

#[test]
fn a_datagram_with_tag_255_is_counted_and_dropped() {
    require_openmpi!();
    let dir: PathBuf = std::env::temp_dir().join(format!("udbtl-forged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test folder");
    let exe = common::program("forged_tag");
    let run = Run::udbtl(2)
        .mca("btl_udbtl_reliable", "0")
        .mca("btl_udbtl_job_key", &JOB_KEY.to_string());
    let _turn = common::serial();
    let mut child = run
        .command(&exe, &[dir.to_str().expect("a UTF-8 temporary folder")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start mpirun");
    let stranger = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the stranger");
    let datagram = forged(255);
    let mut sockets = 0;
    for pid in rank_pids(&dir, &mut child) {
        for port in udp_ports(pid) {
            sockets += 1;
            for _ in 0..FORGED_PER_SOCKET {
                let to = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                stranger
                    .send_to(&datagram, to)
                    .expect("send a forged datagram");
            }
        }
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
    common::assert_said_ok("forged_tag", &out, "forged datagrams with tag 255");
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
