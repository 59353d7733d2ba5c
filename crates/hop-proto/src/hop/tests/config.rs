//! Configuration: the paper's values, the shipped defaults, presets and configuration files.

use super::*;

#[test]
fn defaults_are_the_papers() {
    let c = HopConfig::default();
    assert_eq!(c.max_block_bytes, 1 << 20);
    assert_eq!(c.micro_block_threshold, 16 * 1024);
    assert_eq!(c.backpressure_limit, 1);
    assert_eq!(c.vtx_initial_timeout, Duration::from_secs(60));
    assert_eq!(c.vtx_ttl, 50);
    assert!(c.backpressure && c.ack_withholding && c.pipelining);
    // A full data datagram with envelope, crc and auth trailer fits a 1472-byte UDP payload.
    let worst = hop_wire::envelope::HEADER_LEN
        + hop_wire::hop::HEADER_LEN
        + hop_wire::hop::BSYN_FIXED_LEN.max(hop_wire::hop::DATA_FIXED_LEN)
        + c.packet_payload_bytes
        + hop_wire::envelope::CRC_LEN
        + 24;
    assert!(worst <= 1472, "{worst}");
    assert_eq!(c.txop_packets(), 6);
}

#[test]
fn the_paper_preset_is_the_paper_without_this_implementations_extensions() {
    let p = HopConfig::paper();
    let d = HopConfig::default();
    // §4.2's values and every mechanism of §3, as in the default.
    assert_eq!(p.max_block_bytes, d.max_block_bytes);
    assert_eq!(p.txop_bytes, d.txop_bytes);
    assert_eq!(p.micro_block_threshold, d.micro_block_threshold);
    assert_eq!(p.backpressure_limit, 1);
    assert!(p.backpressure && p.ack_withholding && p.pipelining);
    assert!(p.cache_overheard && p.virtual_retransmission);
    // None of the extensions.
    assert!(!p.adaptive_bsyn_timeout && !p.queue_aware && !p.duplicate_feedback);
    assert!(!p.round_per_next_hop);
    assert_eq!(p.link_window_packets, 0);
    assert_eq!(
        p.flow_start_hold,
        Duration::ZERO,
        "every open flow starts at once"
    );
}

#[test]
fn a_table_names_a_preset_and_overrides_fields_with_durations_as_strings() {
    let t: toml::Table = toml::from_str(
        "preset = \"paper\"\nbsyn_timeout = \"150ms\"\nvtx_initial_timeout = \"2m\"\nvtx_ttl = 9\n",
    )
    .unwrap();
    let c = HopConfig::from_toml(&t).unwrap();
    assert_eq!(
        c,
        HopConfig {
            bsyn_timeout: Duration::from_millis(150),
            vtx_initial_timeout: Duration::from_secs(120),
            vtx_ttl: 9,
            ..HopConfig::paper()
        }
    );
    assert_eq!(
        HopConfig::from_toml(&toml::Table::new()).unwrap(),
        HopConfig::default()
    );
    // What a configuration file can say, it can read back.
    let written = toml::Table::try_from(HopConfig::paper()).unwrap();
    assert_eq!(HopConfig::from_toml(&written).unwrap(), HopConfig::paper());
}

#[test]
fn a_table_with_an_unknown_key_a_bad_duration_or_preset_is_refused() {
    let read = |text: &str| HopConfig::from_toml(&toml::from_str(text).unwrap());
    assert_eq!(
        read("early_bsyn = true"),
        Err(HopConfigError::UnknownKey("early_bsyn".into()))
    );
    assert!(matches!(
        read("vtx_ttl = 3\nbsyn_timeout = 0.2"),
        Err(HopConfigError::Value { key, .. }) if key == "bsyn_timeout"
    ));
    assert!(matches!(
        read("bsyn_timeout = \"soon\""),
        Err(HopConfigError::Value { key, .. }) if key == "bsyn_timeout"
    ));
    assert!(matches!(
        read("preset = \"fast\""),
        Err(HopConfigError::Preset(_))
    ));
}

#[test]
fn control_copies_read_true_false_or_auto_and_auto_follows_the_link() {
    let read = |text: &str| HopConfig::from_toml(&toml::from_str(text).unwrap());
    assert_eq!(HopConfig::default().control_copies, ControlCopies::Auto);
    assert_eq!(HopConfig::paper().control_copies, ControlCopies::Off);
    for (text, want) in [
        ("control_copies = true", ControlCopies::On),
        ("control_copies = false", ControlCopies::Off),
        ("control_copies = \"auto\"", ControlCopies::Auto),
    ] {
        assert_eq!(read(text).unwrap().control_copies, want, "{text}");
    }
    assert!(matches!(
        read("control_copies = \"twice\""),
        Err(HopConfigError::Value { key, .. }) if key == "control_copies"
    ));
    // `auto` is resolved by what the runtime knows of its link; the paper's preset stays off.
    let without = HopConfig::default().for_link(false);
    assert_eq!(without.control_copies, ControlCopies::On);
    assert_eq!(
        HopConfig::default().for_link(true).control_copies,
        ControlCopies::Off
    );
    assert_eq!(
        HopConfig::paper().for_link(false).control_copies,
        ControlCopies::Off
    );
    // A resolved configuration reads back as it was written; what the link does is the
    // runtime's to say again, not a setting.
    let written = toml::Table::try_from(without.clone()).unwrap();
    let read_back = HopConfig::from_toml(&written).unwrap();
    assert_eq!(read_back.link_retries, None);
    assert_eq!(read_back.for_link(false), without);
}
