//! What `hop status` and `hop list` print for people.

use hopd::api;

pub(crate) fn print_status(v: &serde_json::Value) {
    let g = |k: &str| v.get(k).cloned().unwrap_or_default();
    let u = |x: &serde_json::Value| x.as_u64().unwrap_or(0);
    println!(
        "hop {} on node {}, listening on {}, up {}",
        env!("CARGO_PKG_VERSION"),
        g("node_id"),
        g("listen").as_str().unwrap_or("?"),
        human_age(u(&g("uptime_s")))
    );
    if let Some(c) = g("cipher").as_str() {
        let keys = if g("sessions").as_bool() == Some(true) {
            "session keys"
        } else {
            "the mesh key"
        };
        println!("sealing with {c} under {keys}");
    }
    println!("neighbours:");
    for n in g("neighbours").as_array().into_iter().flatten() {
        let heard = match n.get("last_heard_ms").and_then(|x| x.as_u64()) {
            Some(ms) if ms < 10_000 => format!("heard {:.1} s ago", ms as f64 / 1000.0),
            Some(ms) => format!("heard {} ago", human_age(ms / 1000)),
            None => "never heard (check its hopd, address, port, firewall, mesh key)".into(),
        };
        let how = if n.get("discovered").and_then(|x| x.as_bool()) == Some(true) {
            " (discovered)"
        } else {
            ""
        };
        let quality = n
            .get("hello_quality")
            .and_then(|x| x.as_f64())
            .map(|q| format!(", {:.0} % of hellos", q * 100.0))
            .unwrap_or_default();
        // Hop's BSYNs and BACKs lost on the hop, shown from 1 %: over a link without
        // link-layer retries, `[hop] control_copies` sends them twice (hopd.md).
        let pct = |k: &str| n.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0);
        let (from, to) = (pct("control_loss_from_pct"), pct("control_loss_to_pct"));
        let control = if from >= 1.0 || to >= 1.0 {
            format!(", control lost {from:.1} % from it, {to:.1} % to it")
        } else {
            String::new()
        };
        // With sessions, a neighbour whose key is not held yet is not heard at all.
        let key = match n.get("session_key").and_then(|x| x.as_bool()) {
            Some(false) => {
                ", no session key yet (its hopd must have sessions and list this node's key)"
            }
            _ => "",
        };
        println!(
            "  {:>10}  {:<24} {heard}{how}{quality}{control}{key}",
            n.get("id").cloned().unwrap_or_default(),
            n.get("address").and_then(|x| x.as_str()).unwrap_or("?")
        );
    }
    let dir = g("directory");
    if let Some(d) = dir.as_array().filter(|d| !d.is_empty()) {
        println!("nodes in the directory: {}", d.len());
        for e in d {
            let addrs: Vec<&str> = e["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str())
                .collect();
            println!(
                "  {:>10}  {}",
                e.get("id").cloned().unwrap_or_default(),
                addrs.join(", ")
            );
        }
    }
    let outgoing: Vec<api::OutgoingFlow> = g("outgoing")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| serde_json::from_value(f.clone()).ok())
        .collect();
    println!("outgoing transfers: {}", outgoing.len());
    if !outgoing.is_empty() {
        print_list(&outgoing, &api::HeldHere::default());
    }
    let incoming = g("incoming");
    let incoming = incoming.as_array().map(Vec::as_slice).unwrap_or(&[]);
    println!("incoming transfers: {}", incoming.len());
    for f in incoming {
        println!(
            "  {:<14} {:>10} delivered, {:>10} received",
            f.get("flow").and_then(|x| x.as_str()).unwrap_or("?"),
            human_bytes(u(&f["bytes"])),
            human_bytes(u(&f["received_bytes"]))
        );
    }
    println!(
        "storage: {} of {} used; {} file(s) waiting in the inbox for `hop recv`",
        human_bytes(u(&g("storage_bytes"))),
        human_bytes(u(&g("storage_limit_bytes"))),
        g("inbox")
    );
    let c = g("custody");
    if c.is_object() {
        println!(
            "custody: {} block(s), {} held for neighbours ({} stored in all; refused for lack of room: {})",
            u(&c["blocks"]),
            human_bytes(u(&c["bytes"])),
            u(&c["stored_total"]),
            u(&c["full_total"])
        );
    }
    if let Some(line) = disk_waits(&g("custody"), &g("spool")) {
        println!("{line}");
    }
    if let Some(c) = g("counters").as_object() {
        let nonzero: Vec<_> = c.iter().filter(|(_, val)| u(val) > 0).collect();
        println!("counters (non-zero; all in --json):");
        for (k, val) in nonzero {
            println!("  {k:<28} {val}");
        }
    }
    for t in v
        .pointer("/node/transports")
        .and_then(|x| x.as_array())
        .into_iter()
        .flatten()
    {
        let name = t.get(0).and_then(|x| x.as_str()).unwrap_or("?");
        if let Some(e) = t
            .get(1)
            .and_then(|s| s.get("extra"))
            .and_then(|e| e.as_object())
        {
            for line in time_shares(e) {
                println!("{name} {line}");
            }
        }
    }
}

/// Hop's time-in-state counters (docs/hopd.md, "Metrics") as shares of the time they cover:
/// what the node's sending side did since it started, and how long it withheld its upstream
/// neighbours' BSYNs. Nothing when the transport has no such counters.
pub(crate) fn time_shares(extra: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    const STATES: [(&str, &str); 6] = [
        ("time_ready_ms", "ready for the link"),
        ("time_feed_ms", "fed from upstream"),
        ("time_round_ms", "waiting for a BACK"),
        ("time_silent_ms", "next hop silent"),
        ("time_held_ms", "held back"),
        ("time_idle_ms", "nothing to send"),
    ];
    const WITHHELD: [(&str, &str); 2] = [
        ("time_withholding_bp_ms", "for backpressure"),
        ("time_withholding_aw_ms", "for ack withholding"),
    ];
    let ms = |k: &str| extra.get(k).and_then(|v| v.as_u64());
    let Some(spent) = STATES
        .iter()
        .map(|(k, _)| ms(k))
        .collect::<Option<Vec<u64>>>()
    else {
        return Vec::new();
    };
    let total: u64 = spent.iter().sum();
    if total == 0 {
        return Vec::new();
    }
    let pct = |v: u64| format!("{:.0} %", 100.0 * v as f64 / total as f64);
    let states: Vec<String> = STATES
        .iter()
        .zip(&spent)
        .map(|((_, name), v)| format!("{name} {}", pct(*v)))
        .collect();
    let mut out = vec![format!(
        "sending side over {:.1} s: {}",
        total as f64 / 1000.0,
        states.join(", ")
    )];
    let withheld: Vec<String> = WITHHELD
        .iter()
        .filter_map(|(k, name)| ms(k).map(|v| format!("{name} {}", pct(v))))
        .collect();
    if !withheld.is_empty() {
        out.push(format!("withheld upstream BSYNs: {}", withheld.join(", ")));
    }
    out
}

/// How long the disk held the node up: custody writes (from the hand-over to the writer
/// thread until durable: the completing BACK waits for it) and the destination's spool writes
/// (on the event loop), as counts with mean and longest time. Nothing before the first.
pub(crate) fn disk_waits(custody: &serde_json::Value, spool: &serde_json::Value) -> Option<String> {
    let part = |v: &serde_json::Value, count: &str, sum: &str, max: &str, what: &str| {
        let n = v.get(count).and_then(|x| x.as_u64()).filter(|n| *n > 0)?;
        let total = v.get(sum).and_then(|x| x.as_u64()).unwrap_or(0);
        let longest = v.get(max).and_then(|x| x.as_u64()).unwrap_or(0);
        Some(format!(
            "{what} {n}, mean {:.1} ms (longest {:.1} ms)",
            total as f64 / n as f64 / 1000.0,
            longest as f64 / 1000.0
        ))
    };
    let parts: Vec<String> = [
        part(
            custody,
            "writes_timed",
            "write_wait_us",
            "write_wait_max_us",
            "custody writes",
        ),
        part(
            spool,
            "deliveries_timed",
            "deliver_us",
            "deliver_max_us",
            "spool writes",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| format!("disk: {}", parts.join("; ")))
}

/// A size for people: bytes below 10 kB, then kB, MB, GB with one decimal.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [(&str, f64); 3] = [("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (unit, scale) in UNITS {
        if n as f64 >= scale && (unit != "kB" || n >= 10_000) {
            return format!("{:.1} {unit}", n as f64 / scale);
        }
    }
    format!("{n} B")
}

/// A duration in seconds for people: 0.42 s, 12.3 s, then as `human_age`.
pub(crate) fn human_secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else {
        human_age(s.round() as u64)
    }
}

/// A rate for people: kbit/s below 1 Mbit/s, then Mbit/s.
pub(crate) fn human_rate(bps: f64) -> String {
    if bps < 1e6 {
        format!("{:.1} kbit/s", bps / 1e3)
    } else {
        format!("{:.2} Mbit/s", bps / 1e6)
    }
}

/// An age for people: 42s, 3m05s, 2h07m, 3d04h.
pub(crate) fn human_age(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

pub(crate) fn print_list(outgoing: &[api::OutgoingFlow], held: &api::HeldHere) {
    if held.flows > 0 || held.blocks > 0 {
        println!(
            "held here for other nodes: {} relayed flow(s), {} block(s) in custody ({})",
            held.flows,
            held.blocks,
            human_bytes(held.bytes)
        );
    }
    if outgoing.is_empty() {
        println!("no outgoing transfers");
        return;
    }
    // Per destination: how many, how much, and the oldest (a destination that is away
    // shows as a queue that only grows).
    let mut per: std::collections::BTreeMap<u32, (usize, u64, u64, u64)> = Default::default();
    for f in outgoing {
        let e = per.entry(f.to).or_default();
        e.0 += 1;
        e.1 += f.size;
        e.2 += f.bytes_acked.min(f.size);
        e.3 = e.3.max(f.age_s);
    }
    for (to, (n, size, acked, oldest)) in &per {
        println!(
            "to node {to}: {n} transfer(s), {} ({} acknowledged), oldest {}",
            human_bytes(*size),
            human_bytes(*acked),
            human_age(*oldest)
        );
    }
    println!(
        "{:<14} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8}  {:<9} {:<9} name",
        "flow", "to", "size", "handed", "acked", "age", "expires", "client", "priority"
    );
    for f in outgoing {
        println!(
            "{:<14} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8}  {:<9} {:<9} {}",
            f.flow,
            f.to,
            human_bytes(f.size),
            human_bytes(f.bytes_accepted.min(f.size)),
            human_bytes(f.bytes_acked.min(f.size)),
            human_age(f.age_s),
            f.expires_in_s.map_or("-".into(), human_age),
            if f.attached { "waiting" } else { "detached" },
            format!("{:?}", f.priority).to_lowercase(),
            f.name
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{disk_waits, time_shares};

    #[test]
    fn disk_waits_are_means_per_write() {
        let custody = serde_json::json!({"writes_timed": 4, "write_wait_us": 10_000, "write_wait_max_us": 6_500});
        let spool =
            serde_json::json!({"deliveries_timed": 0, "deliver_us": 0, "deliver_max_us": 0});
        assert_eq!(
            disk_waits(&custody, &spool).as_deref(),
            Some("disk: custody writes 4, mean 2.5 ms (longest 6.5 ms)")
        );
        let spool = serde_json::json!({"deliveries_timed": 2, "deliver_us": 3_000, "deliver_max_us": 2_000});
        assert_eq!(
            disk_waits(&custody, &spool).as_deref(),
            Some("disk: custody writes 4, mean 2.5 ms (longest 6.5 ms); spool writes 2, mean 1.5 ms (longest 2.0 ms)")
        );
        // nothing written yet, or an older hopd without the counters: no line
        assert_eq!(
            disk_waits(&serde_json::json!({}), &serde_json::Value::Null),
            None
        );
    }

    #[test]
    fn time_shares_are_parts_of_the_time_counted() {
        let e = serde_json::json!({
            "time_ready_ms": 500, "time_feed_ms": 250, "time_round_ms": 0,
            "time_silent_ms": 250, "time_held_ms": 0, "time_idle_ms": 1000,
            "time_withholding_bp_ms": 1000, "time_withholding_aw_ms": 0, "acks_withheld": 7
        });
        let lines = time_shares(e.as_object().unwrap());
        assert_eq!(
            lines,
            vec![
                "sending side over 2.0 s: ready for the link 25 %, fed from upstream 12 %, \
                 waiting for a BACK 0 %, next hop silent 12 %, held back 0 %, nothing to send 50 %"
                    .to_string(),
                "withheld upstream BSYNs: for backpressure 50 %, for ack withholding 0 %"
                    .to_string(),
            ]
        );
        // another transport's extras, or none counted yet: nothing
        let e = serde_json::json!({"retransmissions": 3});
        assert!(time_shares(e.as_object().unwrap()).is_empty());
    }

    #[test]
    fn sizes_and_ages_for_people() {
        assert_eq!(super::human_bytes(999), "999 B");
        assert_eq!(super::human_bytes(300_000), "300.0 kB");
        assert_eq!(super::human_bytes(25_000_000), "25.0 MB");
        assert_eq!(super::human_bytes(4_294_967_296), "4.3 GB");
        assert_eq!(super::human_bytes(9_999), "9999 B");
        assert_eq!(super::human_age(42), "42s");
        assert_eq!(super::human_age(185), "3m05s");
        assert_eq!(super::human_age(7620), "2h07m");
        assert_eq!(super::human_age(3 * 86_400 + 4 * 3600), "3d04h");
    }
}
