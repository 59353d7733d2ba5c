//! Counters of the daemon and their Prometheus text rendering.

use std::fmt::Write;

use hop_proto::NodeStats;
use serde::Serialize;

/// Daemon-level counters (the core's own are in [`NodeStats`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    pub rx_datagrams: u64,
    /// Datagrams read from the overhearing socket (`overhear = true`).
    pub rx_overheard: u64,
    pub rx_bytes: u64,
    pub rx_rejected: u64,
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
    pub tx_no_address: u64,
    pub auth_failures: u64,
    pub auth_replays: u64,
    pub auth_malformed: u64,
    pub auth_peer_limit: u64,
    pub flows_completed: u64,
    pub flows_failed: u64,
    pub flows_cancelled: u64,
    pub files_received: u64,
    pub files_handed_over: u64,
    pub flows_abandoned: u64,
    pub integrity_failures: u64,
    pub delivered_bytes: u64,
    pub storage_errors: u64,
    #[serde(skip)]
    pub tx_budget_exhausted: bool,
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP hopd_{name} {help}");
    let _ = writeln!(out, "# TYPE hopd_{name} {kind}");
    let _ = writeln!(out, "hopd_{name} {value}");
}

/// Prometheus text exposition of everything the daemon counts.
pub fn render(
    custody: &crate::custody::CustodyUsage,
    stats: &NodeStats,
    c: &Counters,
    flows_out: u64,
    flows_in: u64,
    storage_bytes: u64,
    peers: u64,
) -> String {
    let mut o = String::new();
    let counters: [(&str, &str, u64); 28] = [
        (
            "rx_datagrams_total",
            "UDP datagrams received",
            c.rx_datagrams,
        ),
        (
            "rx_overheard_total",
            "neighbours' datagrams to each other read from the overhearing socket",
            c.rx_overheard,
        ),
        ("rx_bytes_total", "UDP bytes received", c.rx_bytes),
        (
            "rx_rejected_total",
            "authenticated datagrams the core rejected",
            c.rx_rejected,
        ),
        ("tx_datagrams_total", "UDP datagrams sent", c.tx_datagrams),
        ("tx_bytes_total", "UDP bytes sent", c.tx_bytes),
        ("tx_errors_total", "UDP send errors", c.tx_errors),
        (
            "tx_no_address_total",
            "datagrams for a next hop without address",
            c.tx_no_address,
        ),
        (
            "auth_failures_total",
            "datagrams dropped: missing or bad authentication tag",
            c.auth_failures,
        ),
        (
            "auth_replays_total",
            "datagrams dropped: replayed or too old",
            c.auth_replays,
        ),
        (
            "auth_malformed_total",
            "datagrams dropped: malformed envelope",
            c.auth_malformed,
        ),
        (
            "auth_peer_limit_total",
            "datagrams dropped: per-peer state full",
            c.auth_peer_limit,
        ),
        (
            "flows_completed_total",
            "local sends acknowledged end to end",
            c.flows_completed,
        ),
        (
            "flows_failed_total",
            "local sends that failed",
            c.flows_failed,
        ),
        (
            "flows_cancelled_total",
            "local sends cancelled (their client left before the end, or `hop cancel`)",
            c.flows_cancelled,
        ),
        (
            "files_received_total",
            "files received and verified",
            c.files_received,
        ),
        (
            "files_handed_over_total",
            "received files acknowledged by an application",
            c.files_handed_over,
        ),
        (
            "flows_abandoned_total",
            "incoming flows that ended unfinished (aborted by their source, or idle)",
            c.flows_abandoned,
        ),
        (
            "integrity_failures_total",
            "received files whose BLAKE3 check failed",
            c.integrity_failures,
        ),
        (
            "delivered_bytes_total",
            "flow bytes delivered to this destination",
            c.delivered_bytes,
        ),
        (
            "storage_errors_total",
            "storage write errors",
            c.storage_errors,
        ),
        (
            "custody_blocks_stored_total",
            "blocks persisted in custody",
            custody.stored_total,
        ),
        (
            "custody_full_total",
            "custody writes refused, storage full (ack withheld)",
            custody.full_events,
        ),
        (
            "spool_full_total",
            "deliveries refused, disk budget full (end-to-end ack withheld)",
            custody.spool_full_events,
        ),
        (
            "custody_writes_timed_total",
            "custody writes finished (durable or failed)",
            custody.writes_timed,
        ),
        (
            "custody_write_wait_microseconds_total",
            "time custody writes held their blocks' completing BACKs, queueing included",
            custody.write_wait_us,
        ),
        (
            "spool_deliveries_timed_total",
            "deliveries written to the spool",
            custody.deliveries_timed,
        ),
        (
            "spool_deliver_microseconds_total",
            "time the event loop spent writing deliveries to the spool (fsync included)",
            custody.deliver_us,
        ),
    ];
    for (n, h, v) in counters {
        metric(&mut o, n, "counter", h, v);
    }
    metric(
        &mut o,
        "flows_outgoing",
        "gauge",
        "local outgoing flows",
        flows_out,
    );
    metric(
        &mut o,
        "flows_incoming",
        "gauge",
        "incoming flows being spooled",
        flows_in,
    );
    metric(
        &mut o,
        "storage_bytes",
        "gauge",
        "bytes in the spool and inbox",
        storage_bytes,
    );
    metric(
        &mut o,
        "custody_blocks",
        "gauge",
        "blocks held in custody on disk",
        custody.blocks,
    );
    metric(
        &mut o,
        "custody_bytes",
        "gauge",
        "bytes held in custody on disk",
        custody.bytes,
    );
    metric(
        &mut o,
        "custody_limit_bytes",
        "gauge",
        "custody storage limit",
        custody.limit,
    );
    metric(
        &mut o,
        "auth_peers",
        "gauge",
        "peers with replay state",
        peers,
    );
    metric(
        &mut o,
        "core_datagrams_received_total",
        "counter",
        "datagrams the core accepted",
        stats.datagrams_received,
    );
    metric(
        &mut o,
        "core_datagrams_overheard_total",
        "counter",
        "datagrams the core overheard",
        stats.datagrams_overheard,
    );
    metric(
        &mut o,
        "core_datagrams_rejected_total",
        "counter",
        "datagrams the core rejected",
        stats.datagrams_rejected,
    );
    let _ = writeln!(
        o,
        "# HELP hopd_transport_sent_total transport messages sent, by type"
    );
    let _ = writeln!(o, "# TYPE hopd_transport_sent_total counter");
    for (t, s) in &stats.transports {
        for (ty, v) in &s.sent_by_type {
            let _ = writeln!(
                o,
                "hopd_transport_sent_total{{transport=\"{t:?}\",type=\"{ty}\"}} {v}"
            );
        }
    }
    let _ = writeln!(
        o,
        "# HELP hopd_transport_received_total transport messages received, by type"
    );
    let _ = writeln!(o, "# TYPE hopd_transport_received_total counter");
    for (t, s) in &stats.transports {
        for (ty, v) in &s.received_by_type {
            let _ = writeln!(
                o,
                "hopd_transport_received_total{{transport=\"{t:?}\",type=\"{ty}\"}} {v}"
            );
        }
    }
    for (name, help, kind, f) in [
        (
            "transport_retransmissions_total",
            "data packets sent again on the same hop",
            "counter",
            (|s: &hop_proto::TransportStats| s.data_retransmissions)
                as fn(&hop_proto::TransportStats) -> u64,
        ),
        (
            "transport_cache_bytes",
            "bytes held in the transport's caches",
            "gauge",
            |s| s.cache_bytes,
        ),
        (
            "transport_cache_bytes_peak",
            "peak of cache bytes",
            "gauge",
            |s| s.cache_bytes_peak,
        ),
        (
            "transport_flows",
            "flows with state in the transport",
            "gauge",
            |s| s.flows,
        ),
    ] {
        let _ = writeln!(o, "# HELP hopd_{name} {help}");
        let _ = writeln!(o, "# TYPE hopd_{name} {kind}");
        for (t, s) in &stats.transports {
            let _ = writeln!(o, "hopd_{name}{{transport=\"{t:?}\"}} {}", f(s));
        }
    }
    let _ = writeln!(o, "# HELP hopd_transport_extra transport-specific counters");
    let _ = writeln!(o, "# TYPE hopd_transport_extra gauge");
    for (t, s) in &stats.transports {
        for (k, v) in &s.extra {
            let _ = writeln!(
                o,
                "hopd_transport_extra{{transport=\"{t:?}\",name=\"{k}\"}} {v}"
            );
        }
    }
    o
}
