//! dtnd's External Convergence Layer Agent interface (dtn7-rs 0.21, `doc/ecla.md` there):
//! JSON packets tagged by `type`, one per WebSocket text message on dtnd's
//! `ws://127.0.0.1:<web port>/ws/ecla`. A module registers a name; dtnd then offers it the
//! bundles it routes to peers whose convergence layer has that name (`ForwardData`), takes
//! bundles from it (`ForwardData` the other way) and learns peers from its `Beacon`s.
//!
//! dtnd 0.21 also offers the interface over TCP (`--ecla-tcp`), but that connector writes each
//! frame with one non-blocking `try_write` and ignores a short write, so a bundle larger than
//! the socket's free send buffer arrives cut and the stream's framing is lost. The WebSocket
//! connector awaits its writes; the bridge uses it.

use base64::prelude::*;
use bp7::EndpointID;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A packet of the interface, in either direction.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "type")]
pub enum Packet {
    /// Module → dtnd, first: the module's (convergence layer's) name.
    Register(Register),
    /// dtnd → module: registration accepted.
    Registered(Registered),
    /// A peer reachable through the module (module → dtnd), or dtnd's own advertisement
    /// (dtnd → module, when the module asked for beacons).
    Beacon(Beacon),
    /// A bundle: to be carried to `dst` (dtnd → module) or received (module → dtnd).
    ForwardData(ForwardData),
    /// dtnd → module: the registration was refused.
    Error(EclaError),
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Register {
    pub name: String,
    pub enable_beacon: bool,
    pub port: Option<u16>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Registered {
    pub eid: EndpointID,
    pub nodeid: String,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Beacon {
    pub eid: EndpointID,
    /// The peer's address in the module's own terms; dtnd hands it back as `dst`.
    pub addr: String,
    /// CBOR service block (dtn7's `ServiceBlock`): the peer's convergence layers.
    #[serde(with = "b64")]
    pub service_block: Vec<u8>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ForwardData {
    pub src: String,
    pub dst: String,
    pub bundle_id: String,
    #[serde(with = "b64")]
    pub data: Vec<u8>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct EclaError {
    pub reason: String,
}

mod b64 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&BASE64_STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        BASE64_STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// Longest module name dtnd accepts.
pub const MAX_NAME: usize = 64;

/// The service block of a peer reached through convergence layer `cla`: dtn7 decodes it
/// (serde_cbor) as the array `[[[name, port]], {tag: payload}]`; no port (CBOR null) and no
/// services. dtnd then addresses the peer's bundles to `<beacon addr>:<module port>`.
pub fn service_block(cla: &str) -> Vec<u8> {
    assert!(cla.len() <= MAX_NAME, "module names are checked at start");
    let mut b = vec![0x82, 0x81, 0x82];
    let n = cla.len();
    if n < 24 {
        b.push(0x60 | n as u8);
    } else {
        b.extend_from_slice(&[0x78, n as u8]);
    }
    b.extend_from_slice(cla.as_bytes());
    b.push(0xf6); // null: no port
    b.push(0xa0); // no services
    b
}

/// The Hop node a `ForwardData.dst` names: the beacon's address (the node id) with the
/// `:port` dtnd appends.
pub fn parse_dst(dst: &str) -> Option<u32> {
    let node = dst.rsplit_once(':').map_or(dst, |(n, _)| n);
    node.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_have_dtnds_json_shape() {
        let p = Packet::Register(Register {
            name: "hop".into(),
            enable_beacon: false,
            port: None,
        });
        let v: serde_json::Value = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "Register", "name": "hop", "enable_beacon": false, "port": null})
        );
        let fwd = r#"{"type":"ForwardData","src":"","dst":"3:0","bundle_id":"dtn://n1/-1-0","data":"AAEC"}"#;
        match serde_json::from_str::<Packet>(fwd).unwrap() {
            Packet::ForwardData(f) => {
                assert_eq!(f.data, vec![0, 1, 2]);
                assert_eq!(parse_dst(&f.dst), Some(3));
            }
            p => panic!("{p:?}"),
        }
        let reg = r#"{"type":"Registered","eid":[1,"//n1/"],"nodeid":"n1"}"#;
        match serde_json::from_str::<Packet>(reg).unwrap() {
            Packet::Registered(r) => assert_eq!(r.eid.to_string(), "dtn://n1/"),
            p => panic!("{p:?}"),
        }
        assert!(serde_json::from_str::<Packet>(
            r#"{"type":"ForwardData","src":"","dst":"1","bundle_id":"x","data":"*"}"#
        )
        .is_err());
    }

    #[test]
    fn beacon_eid_is_dtn7s_array() {
        let b = Packet::Beacon(Beacon {
            eid: EndpointID::try_from("dtn://n3/").unwrap(),
            addr: "3".into(),
            service_block: service_block("hop"),
        });
        let v: serde_json::Value = serde_json::to_value(&b).unwrap();
        assert_eq!(v["eid"], serde_json::json!([1, "//n3/"]));
    }

    #[test]
    fn service_block_is_the_cbor_dtn7_reads() {
        // [[["hop", null]], {}]
        assert_eq!(
            service_block("hop"),
            [0x82, 0x81, 0x82, 0x63, b'h', b'o', b'p', 0xf6, 0xa0]
        );
        let long = "x".repeat(MAX_NAME);
        let b = service_block(&long);
        assert_eq!(&b[3..5], &[0x78, MAX_NAME as u8]);
        assert_eq!(b.len(), 3 + 2 + MAX_NAME + 2);
    }

    #[test]
    fn destinations() {
        assert_eq!(parse_dst("12:0"), Some(12));
        assert_eq!(parse_dst("7"), Some(7));
        assert_eq!(parse_dst("10.0.0.1:4556"), None);
        assert_eq!(parse_dst(""), None);
    }
}
