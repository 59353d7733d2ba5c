//! Counters of the daemon and their Prometheus exposition (OpenMetrics text, through
//! `prometheus-client`): a snapshot of the daemon's and the core's counters is taken on each
//! scrape and encoded by a collector.

use hop_proto::NodeStats;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
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
    pub auth_not_member: u64,
    pub auth_bad_hello: u64,
    pub auth_previous_key: u64,
    /// Datagrams from nodes whose session key this node does not hold (yet).
    pub auth_no_key: u64,
    pub sessions_completed: u64,
    pub sessions_refused: u64,
    pub sessions_timed_out: u64,
    pub flows_completed: u64,
    pub flows_failed: u64,
    pub flows_cancelled: u64,
    pub files_received: u64,
    pub files_handed_over: u64,
    pub flows_abandoned: u64,
    pub integrity_failures: u64,
    pub duplicates_dropped: u64,
    pub transfers_resumed: u64,
    pub delivered_bytes: u64,
    pub storage_errors: u64,
    #[serde(skip)]
    pub tx_budget_exhausted: bool,
}

/// One neighbour's series.
#[derive(Debug, Clone, Default)]
pub struct NeighbourSample {
    pub id: u32,
    /// Seconds since it was last heard (none: never).
    pub last_heard_s: Option<f64>,
    pub rx_datagrams: u64,
    pub rx_bytes: u64,
    pub tx_datagrams: u64,
    pub tx_bytes: u64,
    /// Smoothed round trip on the hop to it (Hop: BSYN to BACK), seconds.
    pub rtt_s: Option<f64>,
    /// Share of its recent hellos heard (discovery), 0 to 1.
    pub hello_quality: Option<f64>,
    /// Data packets sent to it more than once.
    pub data_retransmissions: u64,
    /// Hop's control datagrams lost, from it and to it (0 to 1).
    pub control_loss: Option<hop_proto::transport::ControlLoss>,
}

/// The buckets of the transfer completion time: from a small file on one hop to a transfer
/// across a partition of a day.
pub fn completion_histogram() -> Histogram {
    Histogram::new([
        0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0, 86400.0,
    ])
}

/// What a scrape reports: taken by the daemon's event loop, encoded off it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub custody: crate::custody::CustodyUsage,
    pub stats: NodeStats,
    pub counters: Counters,
    pub flows_out: u64,
    pub flows_in: u64,
    pub storage_bytes: u64,
    pub peers: u64,
    pub neighbours: Vec<NeighbourSample>,
    /// How long this node's completed transfers took.
    pub completions: Histogram,
    /// Unix time the daemon started, in seconds.
    pub start_time_s: f64,
    pub packet_payload_bytes: u64,
}

/// The OpenMetrics text of a snapshot, names prefixed `hopd_`.
pub fn render(snapshot: Snapshot) -> String {
    let mut registry = Registry::with_prefix("hopd");
    registry.register_collector(Box::new(snapshot));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

type Labels = Vec<(&'static str, String)>;

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    v: u64,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, unit.as_ref(), c.metric_type())?)
}

fn counter_f(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    v: f64,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, unit.as_ref(), c.metric_type())?)
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    v: i64,
) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)
}

/// A counter family: one sample per label set.
fn counters<N: prometheus_client::encoding::EncodeCounterValue + Clone>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    samples: &[(Labels, N)],
) -> std::fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    if samples.is_empty() {
        return Ok(());
    }
    let kind = ConstCounter::new(samples[0].1.clone()).metric_type();
    let mut m = e.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, v) in samples {
        ConstCounter::new(v.clone()).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// A gauge family: one sample per label set.
fn gauges(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    samples: &[(Labels, f64)],
) -> std::fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let kind = ConstGauge::new(0.0f64).metric_type();
    let mut m = e.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, v) in samples {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

/// The transport's name as the configuration spells it (`hop`, `hxh`, `atp`).
fn transport_label(t: &hop_wire::TransportId) -> String {
    format!("{t:?}").to_lowercase()
}

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (c, custody, stats) = (&self.counters, &self.custody, &self.stats);
        let daemon: [(&str, &str, u64); 30] = [
            ("rx_datagrams", "UDP datagrams received", c.rx_datagrams),
            (
                "rx_overheard",
                "neighbours' datagrams to each other read from the overhearing socket",
                c.rx_overheard,
            ),
            ("rx_bytes", "UDP bytes received", c.rx_bytes),
            (
                "rx_rejected",
                "authenticated datagrams the core rejected",
                c.rx_rejected,
            ),
            ("tx_datagrams", "UDP datagrams sent", c.tx_datagrams),
            ("tx_bytes", "UDP bytes sent", c.tx_bytes),
            ("tx_errors", "UDP send errors", c.tx_errors),
            (
                "tx_no_address",
                "datagrams for a next hop without address",
                c.tx_no_address,
            ),
            (
                "auth_failures",
                "datagrams dropped: missing or bad authentication tag",
                c.auth_failures,
            ),
            (
                "auth_replays",
                "datagrams dropped: replayed or too old",
                c.auth_replays,
            ),
            (
                "auth_malformed",
                "datagrams dropped: malformed envelope",
                c.auth_malformed,
            ),
            (
                "auth_peer_limit",
                "datagrams dropped: per-peer state full",
                c.auth_peer_limit,
            ),
            (
                "auth_not_member",
                "datagrams and hellos dropped: their node is not in members_file",
                c.auth_not_member,
            ),
            (
                "auth_bad_hello",
                "hellos dropped: a bad signature, or a node id that is not its key's",
                c.auth_bad_hello,
            ),
            (
                "auth_previous_key",
                "datagrams taken under the mesh key before the last change (hop reload)",
                c.auth_previous_key,
            ),
            (
                "auth_no_key",
                "datagrams dropped: no session key of their sender is held (yet)",
                c.auth_no_key,
            ),
            (
                "sessions_completed",
                "session handshakes completed with neighbours (sessions = true)",
                c.sessions_completed,
            ),
            (
                "sessions_refused",
                "session handshakes refused: not a member, wrong id or certificate",
                c.sessions_refused,
            ),
            (
                "sessions_timed_out",
                "session handshakes started and not answered in time",
                c.sessions_timed_out,
            ),
            (
                "flows_completed",
                "local sends acknowledged end to end",
                c.flows_completed,
            ),
            ("flows_failed", "local sends that failed", c.flows_failed),
            (
                "flows_cancelled",
                "local sends cancelled (their client left before the end, or `hop cancel`)",
                c.flows_cancelled,
            ),
            (
                "files_received",
                "files received and verified",
                c.files_received,
            ),
            (
                "files_handed_over",
                "received files acknowledged by an application",
                c.files_handed_over,
            ),
            (
                "flows_abandoned",
                "incoming flows that ended unfinished (aborted by their source, or idle)",
                c.flows_abandoned,
            ),
            (
                "integrity_failures",
                "received files whose BLAKE3 check failed",
                c.integrity_failures,
            ),
            (
                "duplicates_dropped",
                "resumed transfers dropped because the file was delivered already",
                c.duplicates_dropped,
            ),
            (
                "transfers_resumed",
                "kept transfers resumed after a restart at the byte the destination had",
                c.transfers_resumed,
            ),
            (
                "delivered_bytes",
                "flow bytes delivered to this destination",
                c.delivered_bytes,
            ),
            ("storage_errors", "storage write errors", c.storage_errors),
        ];
        for (name, help, v) in daemon {
            counter(&mut e, name, help, None, v)?;
        }
        counter(
            &mut e,
            "custody_full",
            "custody writes refused, storage full (ack withheld)",
            None,
            custody.full_events,
        )?;
        counter(
            &mut e,
            "spool_full",
            "deliveries refused, disk budget full (end-to-end ack withheld)",
            None,
            custody.spool_full_events,
        )?;
        counter(
            &mut e,
            "custody_writes_timed",
            "custody writes finished (durable or failed)",
            None,
            custody.writes_timed,
        )?;
        counter_f(
            &mut e,
            "custody_write_wait",
            "time custody writes held their blocks' completing BACKs, queueing included",
            Some(Unit::Seconds),
            custody.write_wait_us as f64 / 1e6,
        )?;
        counter(
            &mut e,
            "spool_deliveries_timed",
            "deliveries written to the spool",
            None,
            custody.deliveries_timed,
        )?;
        counter_f(
            &mut e,
            "spool_deliver",
            "time deliveries took to become durable in the spool (queueing and fsync included)",
            Some(Unit::Seconds),
            custody.deliver_us as f64 / 1e6,
        )?;
        counter(
            &mut e,
            "custody_blocks_stored",
            "blocks taken into custody on disk",
            None,
            custody.stored_total,
        )?;
        gauge(
            &mut e,
            "flows_outgoing",
            "local outgoing flows",
            None,
            self.flows_out as i64,
        )?;
        gauge(
            &mut e,
            "flows_incoming",
            "incoming flows being spooled",
            None,
            self.flows_in as i64,
        )?;
        gauge(
            &mut e,
            "storage",
            "bytes in the spool and inbox",
            Some(Unit::Bytes),
            self.storage_bytes as i64,
        )?;
        gauge(
            &mut e,
            "custody_blocks",
            "blocks held in custody on disk",
            None,
            custody.blocks as i64,
        )?;
        gauge(
            &mut e,
            "custody",
            "bytes held in custody on disk",
            Some(Unit::Bytes),
            custody.bytes as i64,
        )?;
        gauge(
            &mut e,
            "custody_limit",
            "custody storage limit",
            Some(Unit::Bytes),
            custody.limit as i64,
        )?;
        gauge(
            &mut e,
            "auth_peers",
            "peers with replay state",
            None,
            self.peers as i64,
        )?;
        gauge(
            &mut e,
            "packet_payload",
            "payload bytes per data packet (fitted to the path MTU)",
            Some(Unit::Bytes),
            self.packet_payload_bytes as i64,
        )?;
        counter(
            &mut e,
            "core_datagrams_received",
            "datagrams the core accepted",
            None,
            stats.datagrams_received,
        )?;
        counter(
            &mut e,
            "core_datagrams_overheard",
            "datagrams the core overheard",
            None,
            stats.datagrams_overheard,
        )?;
        counter(
            &mut e,
            "core_datagrams_rejected",
            "datagrams the core rejected",
            None,
            stats.datagrams_rejected,
        )?;
        let mut sent = Vec::new();
        let mut received = Vec::new();
        let mut retrans = Vec::new();
        let mut cache = Vec::new();
        let mut cache_peak = Vec::new();
        let mut flows = Vec::new();
        let mut events = Vec::new();
        let mut states = Vec::new();
        let mut withholding = Vec::new();
        for (t, s) in &stats.transports {
            let tl = transport_label(t);
            let one = || -> Labels { vec![("transport", tl.clone())] };
            for (ty, v) in &s.sent_by_type {
                sent.push((
                    vec![("transport", tl.clone()), ("type", ty.to_string())],
                    *v,
                ));
            }
            for (ty, v) in &s.received_by_type {
                received.push((
                    vec![("transport", tl.clone()), ("type", ty.to_string())],
                    *v,
                ));
            }
            retrans.push((one(), s.data_retransmissions));
            cache.push((one(), s.cache_bytes as f64));
            cache_peak.push((one(), s.cache_bytes_peak as f64));
            flows.push((one(), s.flows as f64));
            for (k, v) in &s.extra {
                // Time-in-state counters are milliseconds in the core: seconds here, apart
                // from the event counters.
                match k.strip_prefix("time_").and_then(|x| x.strip_suffix("_ms")) {
                    Some(w) if w.starts_with("withholding_") => withholding.push((
                        vec![
                            ("transport", tl.clone()),
                            (
                                "reason",
                                match w {
                                    "withholding_bp" => "backpressure".to_string(),
                                    "withholding_aw" => "ack_withholding".to_string(),
                                    other => other.to_string(),
                                },
                            ),
                        ],
                        *v as f64 / 1000.0,
                    )),
                    Some(state) => states.push((
                        vec![("transport", tl.clone()), ("state", state.to_string())],
                        *v as f64 / 1000.0,
                    )),
                    None => {
                        events.push((vec![("transport", tl.clone()), ("name", k.to_string())], *v))
                    }
                }
            }
        }
        counters(
            &mut e,
            "transport_sent",
            "transport messages sent, by type",
            None,
            &sent,
        )?;
        counters(
            &mut e,
            "transport_received",
            "transport messages received, by type",
            None,
            &received,
        )?;
        counters(
            &mut e,
            "transport_retransmissions",
            "data packets sent again on the same hop",
            None,
            &retrans,
        )?;
        gauges(
            &mut e,
            "transport_cache",
            "bytes held in the transport's caches",
            Some(Unit::Bytes),
            &cache,
        )?;
        gauges(
            &mut e,
            "transport_cache_peak",
            "peak of the transport's cache",
            Some(Unit::Bytes),
            &cache_peak,
        )?;
        gauges(
            &mut e,
            "transport_flows",
            "flows with state in the transport",
            None,
            &flows,
        )?;
        counters(
            &mut e,
            "transport_events",
            "the transport's own event counters, by name",
            None,
            &events,
        )?;
        counters(
            &mut e,
            "sender_state",
            "time the node's sending side spent in each state (docs/hopd.md, Metrics)",
            Some(Unit::Seconds),
            &states,
        )?;
        counters(
            &mut e,
            "withholding",
            "time this node withheld upstream neighbours' BSYNs, by reason (§3.3, §3.5)",
            Some(Unit::Seconds),
            &withholding,
        )?;
        let heard: Vec<(Labels, f64)> = self
            .neighbours
            .iter()
            .filter_map(|n| Some((vec![("neighbour", n.id.to_string())], n.last_heard_s?)))
            .collect();
        gauges(
            &mut e,
            "neighbour_last_heard_age",
            "seconds since anything authenticated was last received from the neighbour",
            Some(Unit::Seconds),
            &heard,
        )?;
        let rx: Vec<(Labels, u64)> = self
            .neighbours
            .iter()
            .map(|n| (vec![("neighbour", n.id.to_string())], n.rx_datagrams))
            .collect();
        counters(
            &mut e,
            "neighbour_received_datagrams",
            "authenticated datagrams received from the neighbour",
            None,
            &rx,
        )?;
        let rxb: Vec<(Labels, u64)> = self
            .neighbours
            .iter()
            .map(|n| (vec![("neighbour", n.id.to_string())], n.rx_bytes))
            .collect();
        counters(
            &mut e,
            "neighbour_received",
            "authenticated bytes received from the neighbour",
            Some(Unit::Bytes),
            &rxb,
        )?;
        let per = |f: &dyn Fn(&NeighbourSample) -> u64| -> Vec<(Labels, u64)> {
            self.neighbours
                .iter()
                .map(|n| (vec![("neighbour", n.id.to_string())], f(n)))
                .collect()
        };
        counters(
            &mut e,
            "neighbour_sent_datagrams",
            "datagrams sent to the neighbour",
            None,
            &per(&|n| n.tx_datagrams),
        )?;
        counters(
            &mut e,
            "neighbour_sent",
            "bytes sent to the neighbour",
            Some(Unit::Bytes),
            &per(&|n| n.tx_bytes),
        )?;
        counters(
            &mut e,
            "neighbour_data_retransmissions",
            "data packets sent to the neighbour more than once",
            None,
            &per(&|n| n.data_retransmissions),
        )?;
        let rtt: Vec<(Labels, f64)> = self
            .neighbours
            .iter()
            .filter_map(|n| Some((vec![("neighbour", n.id.to_string())], n.rtt_s?)))
            .collect();
        gauges(
            &mut e,
            "neighbour_rtt",
            "smoothed round trip on the hop to the neighbour (Hop: BSYN to BACK)",
            Some(Unit::Seconds),
            &rtt,
        )?;
        let quality: Vec<(Labels, f64)> = self
            .neighbours
            .iter()
            .filter_map(|n| Some((vec![("neighbour", n.id.to_string())], n.hello_quality?)))
            .collect();
        let control: Vec<(Labels, f64)> = self
            .neighbours
            .iter()
            .filter_map(|n| Some((n.id, n.control_loss?)))
            .flat_map(|(id, c)| {
                [("from", c.from), ("to", c.to)].map(|(dir, v)| {
                    (
                        vec![
                            ("neighbour", id.to_string()),
                            ("direction", dir.to_string()),
                        ],
                        v,
                    )
                })
            })
            .collect();
        gauges(
            &mut e,
            "neighbour_control_loss_ratio",
            "share of Hop's BSYNs and BACKs lost on the hop (from: the neighbour's, not received here; to: this node's, as the neighbour reports)",
            None,
            &control,
        )?;
        gauges(
            &mut e,
            "neighbour_hello_quality",
            "share of the neighbour's last 32 hellos heard (discovery)",
            None,
            &quality,
        )?;
        {
            let m = e.encode_descriptor(
                "flow_completion",
                "time from opening to the end-to-end acknowledgement of this node's completed transfers",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            self.completions.encode(m)?;
        }
        gauges(
            &mut e,
            "build_info",
            "hopd's version",
            None,
            &[(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1.0,
            )],
        )?;
        let start = ConstGauge::new(self.start_time_s);
        start.encode(e.encode_descriptor(
            "process_start_time",
            "Unix time hopd started",
            Some(&Unit::Seconds),
            start.metric_type(),
        )?)?;
        Ok(())
    }
}
