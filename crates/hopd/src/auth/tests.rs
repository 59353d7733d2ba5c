use super::*;
use hop_wire::{EnvelopeRepr, TransportId};

fn open(a: &mut Authenticator, d: &[u8]) -> Result<NodeId, AuthError> {
    a.open(d, &mut Vec::new())
}

fn datagram(src: NodeId) -> Vec<u8> {
    let mut v = Vec::new();
    EnvelopeRepr {
        transport: TransportId::Hop,
        flags: 0,
        link_src: src,
        link_dst: 2,
    }
    .emit(b"payload", &mut v)
    .unwrap();
    v
}

/// A node on a sealed link leaves the crc32c to `seal` (`Node::set_sealed_link`): what
/// leaves carries a valid checksum in both forms, is opened without comparing it, and a
/// flipped bit fails the tag.
#[test]
fn seal_writes_the_checksum_the_node_left_out() {
    let key = [9u8; 32];
    let mut tx = Authenticator::new(&key, 1, 100, 8);
    let mut rx = Authenticator::new(&key, 2, 100, 8);
    for encrypt in [true, false] {
        tx.set_encrypt(encrypt);
        let mut d = Vec::new();
        EnvelopeRepr {
            transport: TransportId::Hop,
            flags: 0,
            link_src: 1,
            link_dst: 2,
        }
        .emit_for_sealing(b"payload", &mut d)
        .unwrap();
        tx.seal(&mut d, Stream::Data).unwrap();
        assert!(
            Envelope::parse(&d).is_ok(),
            "encrypt {encrypt}: crc on the wire"
        );
        let mut plain = Vec::new();
        let mut bad = d.clone();
        bad[HEADER_LEN + 2] ^= 1;
        assert_eq!(
            rx.open(&bad, &mut plain),
            Err(AuthError::BadTag),
            "encrypt {encrypt}"
        );
        assert_eq!(rx.open(&d, &mut plain), Ok(1), "encrypt {encrypt}");
        let opened = if encrypt { &plain } else { &d };
        assert_eq!(
            Envelope::parse_authenticated(opened).unwrap().body,
            b"payload"
        );
    }
}

/// After a rotation a node seals with the new key and still opens the old one's datagrams
/// (both forms) during the grace period, counting them; not after it.
#[test]
fn a_rotated_key_takes_the_old_one_during_its_grace() {
    let (old, new) = ([7u8; 32], [8u8; 32]);
    let mut sender = Authenticator::new(&old, 1, 100, 8);
    let mut rx = Authenticator::new(&old, 2, 100, 8);
    rx.rotate(&new, std::time::Duration::from_secs(60));
    for encrypt in [true, false] {
        sender.set_encrypt(encrypt);
        let mut d = datagram(1);
        sender.seal(&mut d, Stream::Data).unwrap();
        let mut plain = Vec::new();
        assert_eq!(rx.open(&d, &mut plain), Ok(1), "encrypt {encrypt}");
        if encrypt {
            assert_eq!(
                Envelope::parse_authenticated(&plain).unwrap().body,
                b"payload"
            );
        }
    }
    assert_eq!(rx.opened_with_previous, 2);
    // The rotated node's own datagrams are sealed with the new key.
    let mut d = datagram(2);
    rx.seal(&mut d, Stream::Data).unwrap();
    assert_eq!(open(&mut sender, &d), Err(AuthError::BadTag));
    sender.rotate(&new, std::time::Duration::ZERO);
    assert_eq!(open(&mut sender, &d), Ok(2));
    // Without grace the old key is refused at once.
    let mut late = Authenticator::new(&old, 3, 100, 8);
    let mut d = datagram(3);
    late.seal(&mut d, Stream::Data).unwrap();
    assert_eq!(open(&mut sender, &d), Err(AuthError::BadTag));
}

/// With sessions a node opens only the neighbours whose keys it holds, each with its own
/// windows; a neighbour's previous key is taken during its grace; a forgotten one is not.
#[test]
fn sessions_open_with_each_neighbours_key() {
    let mut a = Authenticator::with_sessions(1, 100, 8, 11, &[1u8; 32]);
    let mut b = Authenticator::with_sessions(2, 100, 8, 22, &[2u8; 32]);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    assert_eq!(open(&mut b, &d), Err(AuthError::NoKey(1)));
    assert!(b.set_peer_key(1, 11, &[1u8; 32], std::time::Duration::from_secs(60)));
    assert!(!b.set_peer_key(1, 11, &[1u8; 32], std::time::Duration::ZERO));
    assert_eq!(open(&mut b, &d), Ok(1));
    assert_eq!(open(&mut b, &d), Err(AuthError::Replay(100)));
    // A new own key: datagrams under the old one still open during the grace.
    let mut old = datagram(1);
    a.seal(&mut old, Stream::Data).unwrap();
    a.set_own(12, &[3u8; 32]);
    let mut new = datagram(1);
    a.seal(&mut new, Stream::Data).unwrap();
    assert_eq!(open(&mut b, &new), Err(AuthError::BadTag));
    assert!(b.set_peer_key(1, 12, &[3u8; 32], std::time::Duration::from_secs(60)));
    assert_eq!(open(&mut b, &new), Ok(1));
    assert_eq!(open(&mut b, &old), Ok(1));
    assert_eq!(open(&mut b, &old), Err(AuthError::Replay(101)));
    // Without grace the old key is refused at once.
    let mut older = datagram(1);
    a.seal(&mut older, Stream::Data).unwrap();
    b.set_peer_key(1, 13, &[4u8; 32], std::time::Duration::ZERO);
    assert_eq!(open(&mut b, &older), Err(AuthError::BadTag));
    // A neighbour that restarted with its counter behind (no clock, no lease) is taken
    // under its new key: each key has windows of its own.
    let mut restarted = Authenticator::with_sessions(1, 5, 8, 14, &[5u8; 32]);
    let mut d = datagram(1);
    restarted.seal(&mut d, Stream::Data).unwrap();
    b.set_peer_key(1, 14, &[5u8; 32], std::time::Duration::ZERO);
    assert_eq!(open(&mut b, &d), Ok(1));
    b.forget_peer(1);
    assert_eq!(open(&mut b, &older), Err(AuthError::NoKey(1)));
    // A node with the mesh key opens none of it.
    let mut m = Authenticator::new(&[1u8; 32], 3, 100, 8);
    assert_eq!(open(&mut m, &new), Err(AuthError::BadTag));
}

#[test]
fn seal_open_round_trip_and_replay() {
    let key = [7u8; 32];
    let mut a = Authenticator::new(&key, 1, 100, 8);
    let mut b = Authenticator::new(&key, 2, 100, 8);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    assert_eq!(d.len(), datagram(1).len() + TRAILER_LEN);
    let env = Envelope::parse(&d).unwrap();
    assert_ne!(env.body, b"payload", "encrypted by default");
    let mut plain = Vec::new();
    assert_eq!(b.open(&d, &mut plain), Ok(1));
    let opened = Envelope::parse_authenticated(&plain).unwrap();
    assert_eq!(
        (opened.body, opened.repr.flags),
        (&b"payload"[..], FLAG_AUTH)
    );
    assert_eq!(open(&mut b, &d), Err(AuthError::Replay(100)));
    let mut d = datagram(1);
    a.set_encrypt(false);
    a.seal(&mut d, Stream::Data).unwrap();
    let env = Envelope::parse(&d).unwrap();
    assert_eq!(env.body, b"payload");
    let mut b = Authenticator::new(&key, 2, 100, 8);
    assert_eq!(open(&mut b, &d), Ok(1));
    assert_eq!(open(&mut b, &d), Err(AuthError::Replay(101)));
}

/// The sealed bytes are fixed by the wire format (ChaCha20-Poly1305 of RFC 8439 over the
/// nonce and associated data documented above), whatever crate computes them: a change of
/// implementation must leave nodes of both versions able to talk.
#[test]
fn sealed_bytes_match_the_wire_format() {
    let mut a = Authenticator::new(&[7u8; 32], 1, 0x0102_0304_0506_0708, 8);
    a.set_encrypt(false);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, "485004010100000700000001000000027061796c6f6164e2eeb1bc0102030405060708cc53d868da529a95a5d9e0229e60cf49");
    let mut b = Authenticator::new(&[7u8; 32], 2, 0, 8);
    assert_eq!(open(&mut b, &d), Ok(1));
}

#[test]
fn seal_leaves_a_valid_checksum_and_rejects_bad_framing() {
    let key = [3u8; 32];
    let mut a = Authenticator::new(&key, 1, 0, 8);
    for len in [0usize, 1, 100, 1400, 65535] {
        let mut d = Vec::new();
        EnvelopeRepr {
            transport: TransportId::Hop,
            flags: 0,
            link_src: 1,
            link_dst: 2,
        }
        .emit(&vec![0xa5; len], &mut d)
        .unwrap();
        a.seal(&mut d, Stream::Control).unwrap();
        let env = Envelope::parse(&d).unwrap();
        assert_eq!(env.repr.flags & FLAG_AUTH, FLAG_AUTH);
        assert_eq!(env.body.len(), len);
        assert_eq!(env.trailer.len(), TRAILER_LEN);
        // Sealing twice changes nothing.
        let before = d.clone();
        a.seal(&mut d, Stream::Control).unwrap();
        assert_eq!(d, before);
    }
    let good = datagram(1);
    let mut short = good[..HEADER_LEN + 2].to_vec();
    assert!(matches!(
        a.seal(&mut short, Stream::Data),
        Err(AuthError::Malformed(_))
    ));
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(
        a.seal(&mut long, Stream::Data),
        Err(AuthError::Malformed(_))
    ));
    let mut magic = good.clone();
    magic[0] ^= 0xff;
    assert!(matches!(
        a.seal(&mut magic, Stream::Data),
        Err(AuthError::Malformed(_))
    ));
    assert!(matches!(
        a.seal(&mut Vec::new(), Stream::Data),
        Err(AuthError::Malformed(_))
    ));
}

#[test]
fn forged_and_wrong_key_rejected() {
    let mut a = Authenticator::new(&[7u8; 32], 1, 0, 8);
    let mut b = Authenticator::new(&[8u8; 32], 2, 0, 8);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    assert_eq!(open(&mut b, &d), Err(AuthError::BadTag));
    let mut b = Authenticator::new(&[7u8; 32], 2, 0, 8);
    let n = d.len();
    d[n - 1] ^= 1;
    assert_eq!(open(&mut b, &d), Err(AuthError::BadTag));
    assert_eq!(open(&mut b, &datagram(1)), Err(AuthError::Unauthenticated));
    assert_eq!(b.peers(), 0);
}

/// An encrypted body, or the header it is bound to, changed on the way (crc fixed up as an
/// attacker would) fails; nothing of the plaintext is handed out.
#[test]
fn encrypted_bodies_and_their_headers_are_bound() {
    let key = [9u8; 32];
    let mut a = Authenticator::new(&key, 1, 0, 8);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    assert!(!d.windows(7).any(|w| w == b"payload"));
    let end = HEADER_LEN + b"payload".len();
    let fix_crc = |d: &mut Vec<u8>| {
        let crc = crc32c::crc32c(&d[..end]);
        d[end..end + CRC_LEN].copy_from_slice(&crc.to_be_bytes());
    };
    for at in [HEADER_LEN, end - 1, 12, 3] {
        let mut t = d.clone();
        t[at] ^= 0x10;
        fix_crc(&mut t);
        let mut b = Authenticator::new(&key, 2, 0, 8);
        let mut plain = vec![1, 2, 3];
        let r = b.open(&t, &mut plain);
        assert!(r.is_err(), "byte {at}: {r:?}");
        assert!(plain.is_empty(), "byte {at}");
    }
    let mut b = Authenticator::new(&key, 2, 0, 8);
    let mut plain = Vec::new();
    assert_eq!(b.open(&d, &mut plain), Ok(1));
    assert_eq!(
        Envelope::parse_authenticated(&plain).unwrap().body,
        b"payload"
    );
}

/// The encrypted form's bytes are fixed by the wire format as well.
#[test]
fn encrypted_bytes_match_the_wire_format() {
    let mut a = Authenticator::new(&[7u8; 32], 1, 0x0102_0304_0506_0708, 8);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    // Cross-checked with another implementation of RFC 8439 (Python `cryptography`):
    // ciphertext 73d8f2fdbb60a2, tag a2924265f38de64a90926424579a968a (envelope version 4).
    assert_eq!(hex, "4850040103000007000000010000000273d8f2fdbb60a22a70026a0102030405060708a2924265f38de64a90926424579a968a");
    let mut b = Authenticator::new(&[7u8; 32], 2, 0, 8);
    assert_eq!(open(&mut b, &d), Ok(1));
}

#[test]
fn window_accepts_reordering_once() {
    let key = [1u8; 32];
    let mut a = Authenticator::new(&key, 1, 5, 8);
    let mut b = Authenticator::new(&key, 2, 0, 8);
    let sealed: Vec<Vec<u8>> = (0..200)
        .map(|_| {
            let mut d = datagram(1);
            a.seal(&mut d, Stream::Data).unwrap();
            d
        })
        .collect();
    for i in (0..200).rev() {
        assert!(open(&mut b, &sealed[i]).is_ok(), "{i}");
    }
    for d in &sealed {
        assert!(matches!(open(&mut b, d), Err(AuthError::Replay(_))));
    }
}

#[test]
fn streams_reorder_against_each_other() {
    // A control datagram sealed after thousands of data datagrams arrives first; the
    // data datagrams queued behind it are still accepted, and replays of either are not.
    let key = [3u8; 32];
    let mut a = Authenticator::new(&key, 1, 1_000, 8);
    let mut b = Authenticator::new(&key, 2, 0, 8);
    let data: Vec<Vec<u8>> = (0..3 * REPLAY_WINDOW)
        .map(|_| {
            let mut d = datagram(1);
            a.seal(&mut d, Stream::Data).unwrap();
            d
        })
        .collect();
    let mut ctrl = datagram(1);
    a.seal(&mut ctrl, Stream::Control).unwrap();
    assert_eq!(open(&mut b, &ctrl), Ok(1));
    for d in &data {
        assert_eq!(open(&mut b, d), Ok(1));
    }
    assert!(matches!(open(&mut b, &ctrl), Err(AuthError::Replay(_))));
    assert!(matches!(open(&mut b, &data[0]), Err(AuthError::Replay(_))));
    assert_eq!(b.peers(), 1);
}

#[test]
fn counters_stay_in_their_stream() {
    let mut a = Authenticator::new(&[1u8; 32], 1, u64::MAX, 8);
    let mut d = datagram(1);
    a.seal(&mut d, Stream::Data).unwrap();
    let mut c = datagram(1);
    a.seal(&mut c, Stream::Control).unwrap();
    let counter = |v: &[u8]| {
        let e = Envelope::parse(v).unwrap();
        u64::from_be_bytes(e.trailer[..8].try_into().unwrap())
    };
    assert_eq!(Stream::of(counter(&d)), Stream::Data);
    assert_eq!(Stream::of(counter(&c)), Stream::Control);
    assert_eq!(Stream::of(a.counters[0]), Stream::Data);
}

#[test]
fn window_shift_keeps_history() {
    let mut w = Window::new(10);
    w.mark(75);
    assert!(!w.check(10));
    assert!(!w.check(75));
    assert!(w.check(11));
    w.mark(75 + 130);
    assert!(!w.check(10));
    assert!(!w.check(75));
    assert!(w.check(76));
    w.mark(10_000);
    assert!(!w.check(75));
    assert!(w.check(10_000 - 5));
}

#[test]
fn peer_limit_bounds_state() {
    let key = [1u8; 32];
    let mut b = Authenticator::new(&key, 2, 0, 1);
    let mut a1 = Authenticator::new(&key, 1, 0, 8);
    let mut a3 = Authenticator::new(&key, 3, 0, 8);
    let mut d1 = datagram(1);
    a1.seal(&mut d1, Stream::Data).unwrap();
    let mut d3 = datagram(3);
    a3.seal(&mut d3, Stream::Control).unwrap();
    assert!(open(&mut b, &d1).is_ok());
    assert_eq!(open(&mut b, &d3), Err(AuthError::TooManyPeers(3)));
}

/// A sender sealing with AES-256-GCM marks its datagrams; a receiver opens them whatever
/// cipher it seals with itself, in both forms and with sessions; the flag is covered by the
/// tag, and the AES tag is not the ChaCha20-Poly1305 one under the raw key.
#[test]
fn aes_gcm_datagrams_are_flagged_and_opened_by_any_receiver() {
    let key = [5u8; 32];
    let mut tx = Authenticator::new(&key, 1, 100, 8);
    let mut rx = Authenticator::new(&key, 2, 100, 8);
    tx.set_cipher(Cipher::Aes256Gcm);
    for encrypt in [true, false] {
        tx.set_encrypt(encrypt);
        let mut d = datagram(1);
        tx.seal(&mut d, Stream::Data).unwrap();
        assert_ne!(d[4] & FLAG_AES_GCM, 0, "encrypt {encrypt}");
        let mut plain = Vec::new();
        // Clearing the flag makes a receiver try ChaCha20-Poly1305: refused, not misread.
        let mut cleared = d.clone();
        cleared[4] &= !FLAG_AES_GCM;
        assert_eq!(rx.open(&cleared, &mut plain), Err(AuthError::BadTag));
        assert_eq!(rx.open(&d, &mut plain), Ok(1), "encrypt {encrypt}");
        let opened = if encrypt { &plain } else { &d };
        assert_eq!(
            Envelope::parse_authenticated(opened).unwrap().body,
            b"payload"
        );
    }
    // Back to the default: unflagged, and still opened.
    tx.set_cipher(Cipher::ChaCha20Poly1305);
    let mut d = datagram(1);
    tx.seal(&mut d, Stream::Data).unwrap();
    assert_eq!(d[4] & FLAG_AES_GCM, 0);
    assert_eq!(open(&mut rx, &d), Ok(1));

    // Sessions: the neighbour's sender key serves both ciphers.
    let own = [6u8; 32];
    let mut s_tx = Authenticator::with_sessions(1, 100, 8, 11, &own);
    s_tx.set_cipher(Cipher::Aes256Gcm);
    let mut s_rx = Authenticator::with_sessions(2, 100, 8, 12, &[4u8; 32]);
    s_rx.set_peer_key(1, 11, &own, std::time::Duration::from_secs(1));
    let mut d = datagram(1);
    s_tx.seal(&mut d, Stream::Control).unwrap();
    assert_eq!(s_rx.open(&d, &mut Vec::new()), Ok(1));
}

/// The AES key is derived from the datagram key, so the two tags of one datagram differ and
/// the AES key is not the raw key.
#[test]
fn the_aes_key_is_derived_not_the_datagram_key() {
    let key = [3u8; 32];
    let k = aead_key(&key);
    let raw_aes = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).unwrap());
    let nonce = || Authenticator::nonce(1, 7);
    let derived = k
        .get(Cipher::Aes256Gcm)
        .seal_in_place_separate_tag(nonce(), Aad::from(b"x"), &mut [])
        .unwrap();
    let raw = raw_aes
        .seal_in_place_separate_tag(nonce(), Aad::from(b"x"), &mut [])
        .unwrap();
    assert_ne!(derived.as_ref(), raw.as_ref());
}
