//! What the bridge reads of a bundle (RFC 9171 primary block, decoded by `bp7`): its id, for
//! duplicate detection and names, and how long it has left to live, which becomes the Hop
//! transfer's lifetime.

use std::time::Duration;

/// Milliseconds from the Unix epoch to the DTN epoch (2000-01-01T00:00:00Z, RFC 9171 §4.2.6).
const MS_1970_TO_2000: u64 = 946_684_800_000;

/// The parts of a bundle the bridge uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleInfo {
    /// dtn7's bundle id: source EID, creation time, sequence number (and fragment offset).
    pub id: String,
    pub destination: String,
    /// Time left before the bundle's lifetime ends; zero: ended.
    pub remaining: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("not a BPv7 bundle: {0}")]
pub struct NotABundle(String);

/// Decode `data`'s primary block. `now_unix_ms` is the local clock. A bundle created by a
/// node without a clock (creation time 0, RFC 9171 §4.2.6) has its whole lifetime left: the
/// bundle age block it carries then is not read, so such a bundle may be carried past its end;
/// dtnd drops it when it arrives.
pub fn inspect(data: &[u8], now_unix_ms: u64) -> Result<BundleInfo, NotABundle> {
    // bp7's decoder is strict CBOR but not hardened against every input; a panic inside it
    // must not take the bridge (and the bundles it holds) down.
    let parsed = std::panic::catch_unwind(|| bp7::Bundle::try_from(data));
    let bundle = match parsed {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(NotABundle(e.to_string())),
        Err(_) => return Err(NotABundle("the decoder failed".into())),
    };
    let created = bundle.primary.creation_timestamp.dtntime();
    let lifetime = bundle.primary.lifetime;
    let remaining = if created == 0 {
        lifetime
    } else {
        let now = now_unix_ms.saturating_sub(MS_1970_TO_2000);
        lifetime.saturating_sub(Duration::from_millis(now.saturating_sub(created)))
    };
    Ok(BundleInfo {
        id: bundle.id(),
        destination: bundle.primary.destination.to_string(),
        remaining,
    })
}

/// The name a bundle travels under in Hop: its id with every byte outside
/// `A-Z a-z 0-9 . _ - @` percent-escaped (so no `/`: hopd's names are paths), at most 255
/// bytes (a longer one keeps its first 200 bytes and a hash of the whole id).
pub fn hop_name(id: &str) -> String {
    let mut s = String::with_capacity(id.len() + 8);
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    if s.len() > 255 {
        let h = blake3::hash(id.as_bytes()).to_hex();
        s.truncate(200);
        s.push('~');
        s.push_str(&h[..32]);
    }
    s
}

pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bp7::flags::BundleControlFlags;

    /// A bundle as dtnd builds one: `src` to `dst`, `payload`, created at `created_unix_ms`
    /// (0: by a node without a clock), `lifetime`.
    pub fn make(
        src: &str,
        dst: &str,
        payload: &[u8],
        created_unix_ms: u64,
        seq: u64,
        lifetime: Duration,
    ) -> Vec<u8> {
        let dtntime = if created_unix_ms == 0 {
            0
        } else {
            created_unix_ms - MS_1970_TO_2000
        };
        let primary = bp7::primary::PrimaryBlockBuilder::default()
            .destination(bp7::EndpointID::try_from(dst).unwrap())
            .source(bp7::EndpointID::try_from(src).unwrap())
            .report_to(bp7::EndpointID::try_from(src).unwrap())
            .creation_timestamp(bp7::CreationTimestamp::with_time_and_seq(dtntime, seq))
            .lifetime(lifetime)
            .bundle_control_flags(BundleControlFlags::BUNDLE_MUST_NOT_FRAGMENTED.bits())
            .build()
            .unwrap();
        let mut b = bp7::bundle::BundleBuilder::default()
            .primary(primary)
            .canonicals(vec![bp7::canonical::new_payload_block(
                bp7::flags::BlockControlFlags::empty(),
                payload.to_vec(),
            )])
            .build()
            .unwrap();
        b.to_cbor()
    }

    #[test]
    fn id_destination_and_time_left() {
        let now = 1_800_000_000_000;
        let b = make(
            "dtn://n1/",
            "dtn://n3/incoming",
            b"hello",
            now - 10_000,
            7,
            Duration::from_secs(3600),
        );
        let i = inspect(&b, now).unwrap();
        assert_eq!(
            i.id,
            format!("dtn://n1/-{}-7", now - 10_000 - MS_1970_TO_2000)
        );
        assert_eq!(i.destination, "dtn://n3/incoming");
        assert_eq!(i.remaining, Duration::from_secs(3590));
        // Past its end.
        assert_eq!(
            inspect(&b, now + 3_600_000).unwrap().remaining,
            Duration::ZERO
        );
        // Created without a clock: the whole lifetime.
        let b0 = make(
            "dtn://n1/",
            "dtn://n3/x",
            b"x",
            0,
            1,
            Duration::from_secs(60),
        );
        assert_eq!(
            inspect(&b0, now).unwrap().remaining,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn garbage_is_refused_not_a_panic() {
        for data in [&b""[..], b"\x9f\xff", b"HOPF", &[0x9f; 64], &[0xff; 9]] {
            assert!(inspect(data, 0).is_err());
        }
        let good = make(
            "dtn://a/",
            "dtn://b/",
            &[7; 100],
            0,
            0,
            Duration::from_secs(1),
        );
        for cut in [1, good.len() / 2, good.len() - 1] {
            assert!(inspect(&good[..cut], 0).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn names_are_single_path_components() {
        assert_eq!(hop_name("dtn://n1/-755-0"), "dtn%3A%2F%2Fn1%2F-755-0");
        let long = format!("dtn://{}/-1-0", "n".repeat(300));
        let n = hop_name(&long);
        assert!(n.len() <= 255 && !n.contains('/'));
        assert_ne!(n, hop_name(&format!("dtn://{}/-1-1", "n".repeat(300))));
    }
}
