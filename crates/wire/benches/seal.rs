//! What protecting one datagram costs, at the payloads of an MTU-1500 path,
//! an MTU-9000 path and UDP loopback: the CRC-32 of plain mode, sealing
//! authenticated (in place) and encrypted, and opening each.
//!
//! `cargo bench -p udbtl-wire --bench seal`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use udbtl_wire::datagram::{self, AuthKey, Epochs};
use udbtl_wire::seal::{self, Protection, SEALED_HEADER_LEN, SealKey, Sender};
use udbtl_wire::{btl, rel};

const PAYLOADS: [usize; 3] = [1416, 8952, 65_000];

/// An unsealed datagram with `payload` bytes, its headers written.
fn datagram(payload: usize, flags: u16) -> Vec<u8> {
    let mut bytes = vec![0x5au8; SEALED_HEADER_LEN + payload];
    btl::Repr {
        tag: 9,
        job_key: 7,
        reliable: true,
    }
    .emit(&mut btl::Packet::new_unchecked(&mut bytes[..]));
    rel::Repr {
        src: 3,
        flags,
        ..Default::default()
    }
    .emit(&mut datagram::extension_mut(&mut bytes).expect("sized above"));
    bytes
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("protect");
    for payload in PAYLOADS {
        group.throughput(Throughput::Bytes(payload as u64));
        let mut plain = datagram(payload, rel::FLAG_CHECKSUM);
        group.bench_function(BenchmarkId::new("crc32", payload), |b| {
            b.iter(|| {
                let (head, payload) = plain.split_at_mut(datagram::HEADER_LEN);
                datagram::fill_checksum(head, &[payload])
            })
        });
        for protection in [Protection::Authenticate, Protection::Encrypt] {
            let name = match protection {
                Protection::Encrypt => "encrypt",
                _ => "authenticate",
            };
            let sender = Sender { job_key: 7, id: 3 };
            let key = SealKey::derive(&AuthKey([1; 32]), 5, sender, 0, protection);
            let mut bytes = datagram(payload, protection.flags());
            let mut pn = 1;
            group.bench_function(BenchmarkId::new(format!("seal {name}"), payload), |b| {
                b.iter(|| {
                    pn += 1;
                    seal::seal(&mut bytes, &key, pn, Epochs::default()).expect("sealed")
                })
            });
            let mut sealed = datagram(payload, protection.flags());
            seal::seal(&mut sealed, &key, 1, Epochs::default()).expect("sealed");
            let mut copy = sealed.clone();
            group.bench_function(BenchmarkId::new(format!("open {name}"), payload), |b| {
                b.iter(|| {
                    copy.copy_from_slice(&sealed);
                    assert!(seal::open(&mut copy, &key, Epochs::default()));
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
