//! Arbitrary bytes through the envelope and Hop decoders: no panic, and whatever parses
//! re-encodes to the same bytes.

#![no_main]

use hop_wire::hop::HopMessage;
use hop_wire::{Envelope, EnvelopeRepr};
use libfuzzer_sys::fuzz_target;

fn check_hop(bytes: &[u8]) {
    if let Ok(msg) = HopMessage::parse(bytes) {
        let mut out = Vec::new();
        msg.emit(&mut out).expect("a parsed message re-encodes");
        assert_eq!(out, bytes);
    }
}

fuzz_target!(|data: &[u8]| {
    check_hop(data);
    if let Ok(env) = Envelope::parse(data) {
        check_hop(env.body);
        if env.trailer.is_empty() {
            let mut out = Vec::new();
            EnvelopeRepr::emit(&env.repr, env.body, &mut out)
                .expect("a parsed envelope re-encodes");
            assert_eq!(out, data);
        }
    }
});
