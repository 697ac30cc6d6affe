use std::time::Instant;
use ring::aead::*;
fn bench(name: &str, len: usize, mut f: impl FnMut(&mut [u8])) {
    let mut buf = vec![7u8; len];
    let n = 200_000usize;
    for _ in 0..1000 { f(&mut buf); }
    let t = Instant::now();
    for _ in 0..n { f(&mut buf); }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{name:40} {len:6} B {ns:8.1} ns  {:6.2} GB/s", len as f64 / ns);
}
fn main() { extra();
    let key = [3u8; 32];
    let gcm = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap());
    let gcm128 = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key[..16]).unwrap());
    let cc = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).unwrap());
    for len in [64usize, 1416, 8952] {
        bench("blake3 keyed (8B tag)", len, |b| { let h = blake3::keyed_hash(&key, b); std::hint::black_box(h); });
        bench("crc32fast", len, |b| { std::hint::black_box(crc32fast::hash(b)); });
        let mut pn = 0u64;
        bench("ring aes256gcm gmac (aad only)", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = gcm.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nb), Aad::from(&*b), &mut []).unwrap(); std::hint::black_box(t); });
        bench("ring aes256gcm encrypt", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = gcm.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nb), Aad::from(&[0u8;40]), b).unwrap(); std::hint::black_box(t); });
        bench("ring aes128gcm encrypt", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = gcm128.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nb), Aad::from(&[0u8;40]), b).unwrap(); std::hint::black_box(t); });
        bench("ring chacha20poly1305 encrypt", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = cc.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nb), Aad::from(&[0u8;40]), b).unwrap(); std::hint::black_box(t); });
        bench("ring chacha20poly1305 aad only", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = cc.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nb), Aad::from(&*b), &mut []).unwrap(); std::hint::black_box(t); });
        {
            use aes_gcm::{Aes256Gcm, KeyInit, aead::AeadInPlace};
            let c = Aes256Gcm::new_from_slice(&key).unwrap();
            bench("rustcrypto aes256gcm encrypt", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
                let t = c.encrypt_in_place_detached(&nb.into(), &[0u8;40], b).unwrap(); std::hint::black_box(t); });
        }
    }
    bench("key setup: blake3 derive + ring aes256gcm", 0, |_| { let k = blake3::keyed_hash(&key, b"udbtl pair 1234567"); let g = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k.as_bytes()).unwrap()); std::hint::black_box(g); });
    bench("key setup: ring chacha", 0, |_| { let k = blake3::keyed_hash(&key, b"udbtl pair 1234567"); let g = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, k.as_bytes()).unwrap()); std::hint::black_box(g); });
    println!("LessSafeKey size {}", std::mem::size_of::<LessSafeKey>());
}

pub fn extra() {
    use aws_lc_rs::aead as a;
    let key=[3u8;32];
    let k = a::LessSafeKey::new(a::UnboundKey::new(&a::AES_256_GCM, &key).unwrap());
    let k128 = a::LessSafeKey::new(a::UnboundKey::new(&a::AES_128_GCM, &key[..16]).unwrap());
    let mut pn = 0u64;
    for len in [1416usize, 8952] {
        bench("awslc aes256gcm gmac (aad only)", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = k.seal_in_place_separate_tag(a::Nonce::assume_unique_for_key(nb), a::Aad::from(&*b), &mut []).unwrap(); std::hint::black_box(t); });
        bench("awslc aes256gcm encrypt", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = k.seal_in_place_separate_tag(a::Nonce::assume_unique_for_key(nb), a::Aad::from(&[0u8;40]), b).unwrap(); std::hint::black_box(t); });
        bench("awslc aes128gcm encrypt", len, |b| { pn+=1; let mut nb=[0u8;12]; nb[4..].copy_from_slice(&pn.to_be_bytes());
            let t = k128.seal_in_place_separate_tag(a::Nonce::assume_unique_for_key(nb), a::Aad::from(&[0u8;40]), b).unwrap(); std::hint::black_box(t); });
        {
            use ghash::{GHash, universal_hash::{KeyInit, UniversalHash}};
            bench("rustcrypto ghash", len, |b| { let mut g = GHash::new(&[1u8;16].into()); g.update_padded(b); std::hint::black_box(g.finalize()); });
            use poly1305::Poly1305;
            bench("rustcrypto poly1305", len, |b| { let mut g = Poly1305::new(&[1u8;32].into()); g.update_padded(b); std::hint::black_box(g.finalize()); });
        }
    }
}
