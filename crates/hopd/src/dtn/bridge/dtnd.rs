//! dtnd's side: the registered ECLA session, the peers announced to dtnd, and the bundles
//! dtnd hands over, passed to the sender.

use super::*;

pub(super) async fn ecla_task(shared: Arc<Shared>, fwd: mpsc::UnboundedSender<ForwardData>) {
    let url = format!("ws://{}/ws/ecla", shared.cfg.dtnd);
    let mut failures = 0u32;
    loop {
        match ecla_session(&shared, &url, &fwd).await {
            Ok(()) => {
                failures = 0;
                warn!(%url, "dtnd closed the convergence layer session; reconnecting");
            }
            Err(e) => {
                if failures == 0 {
                    warn!(%url, error = %e, "dtnd's external convergence layer not reachable: is dtnd running on this host with --ecla and web port {}? retrying", shared.cfg.dtnd.port());
                } else {
                    debug!(%url, error = %e, "dtnd still not reachable");
                }
                failures += 1;
            }
        }
        shared.ecla.send_replace(None);
        tokio::time::sleep(Duration::from_millis(
            (250 * u64::from(failures.min(8))).max(250),
        ))
        .await;
    }
}

async fn ecla_session(
    shared: &Arc<Shared>,
    url: &str,
    fwd: &mpsc::UnboundedSender<ForwardData>,
) -> Result<(), String> {
    let (ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sink, mut stream) = ws.split();
    let register = Packet::Register(Register {
        name: shared.cfg.cla_name.clone(),
        enable_beacon: false,
        port: None,
    });
    let text = serde_json::to_string(&register).expect("packets serialise");
    sink.send(Message::Text(text.into()))
        .await
        .map_err(|e| e.to_string())?;
    // dtnd answers Registered, or Error (e.g. the name is taken by another module).
    let reply = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = stream.next().await {
            match m {
                Ok(Message::Text(t)) => match serde_json::from_str::<Packet>(&t) {
                    Ok(Packet::Registered(r)) => return Ok(r),
                    Ok(Packet::Error(e)) => return Err(format!("dtnd refused the registration: {} (another hop-dtn, or a CLA of that name?)", e.reason)),
                    _ => continue,
                },
                Ok(_) => continue,
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("closed before registering".to_string())
    })
    .await
    .map_err(|_| "no answer to the registration in 10 s".to_string())??;
    // The peers first: a bundle dtnd dispatches before it knows a route waits for its
    // janitor (if it runs at all).
    for b in beacons(&shared.cfg) {
        let text = serde_json::to_string(&b).expect("packets serialise");
        sink.send(Message::Text(text.into()))
            .await
            .map_err(|e| e.to_string())?;
    }
    info!(eid = %reply.eid, node = %reply.nodeid, cla = %shared.cfg.cla_name, peers = shared.cfg.peers.len(), "registered with dtnd");

    let (tx, mut rx) = mpsc::channel::<(Packet, oneshot::Sender<bool>)>(64);
    let writer = tokio::spawn(async move {
        while let Some((p, done)) = rx.recv().await {
            let text = serde_json::to_string(&p).expect("packets serialise");
            let ok = sink.send(Message::Text(text.into())).await.is_ok();
            let _ = done.send(ok);
            if !ok {
                break;
            }
        }
    });
    let link = EclaLink { tx };
    shared.ecla.send_replace(Some(link.clone()));
    let beacons = tokio::spawn(announce(shared.clone(), link));
    let mut result = Ok(());
    while let Some(m) = stream.next().await {
        match m {
            Ok(Message::Text(t)) => match serde_json::from_str::<Packet>(&t) {
                Ok(Packet::ForwardData(f)) => {
                    shared.count(|c| c.from_dtnd += 1);
                    let _ = fwd.send(f);
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "unreadable packet from dtnd, ignored"),
            },
            Ok(Message::Close(_)) => break,
            Ok(_) => {}
            Err(e) => {
                result = Err(e.to_string());
                break;
            }
        }
    }
    beacons.abort();
    writer.abort();
    result
}

/// The beacons that announce each peer as reachable through this convergence layer.
fn beacons(cfg: &Config) -> Vec<Packet> {
    let block = ecla::service_block(&cfg.cla_name);
    cfg.peers
        .iter()
        .filter_map(|p| {
            // Checked when the configuration was read.
            let eid = bp7::EndpointID::try_from(p.eid.as_str()).ok()?;
            Some(Packet::Beacon(Beacon {
                eid,
                addr: p.node.to_string(),
                service_block: block.clone(),
            }))
        })
        .collect()
}

/// Announces the peers again every `announce_interval` (dtnd forgets a peer it has not
/// heard of for its peer timeout, 20 s by default, when its janitor runs).
async fn announce(shared: Arc<Shared>, link: EclaLink) {
    let mut tick = tokio::time::interval(shared.cfg.announce_interval);
    tick.tick().await; // the first round went out with the registration
    loop {
        tick.tick().await;
        for b in beacons(&shared.cfg) {
            if !link.send(b).await {
                return;
            }
        }
    }
}
