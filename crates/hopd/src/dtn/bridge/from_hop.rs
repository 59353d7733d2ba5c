//! Bundles from Hop to dtnd: each received bundle handed to the local dtnd once.

use super::*;

pub(super) async fn receiver_task(shared: Arc<Shared>) {
    let mut warned = false;
    loop {
        match receive(&shared).await {
            Ok(()) => warned = false,
            Err(e) => {
                if !warned {
                    warn!(error = %e, socket = %shared.cfg.hopd_socket.display(), "not receiving from hopd; retrying");
                    warned = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn receive(shared: &Arc<Shared>) -> std::io::Result<()> {
    let mut s = UnixStream::connect(&shared.cfg.hopd_socket).await?;
    let req = Request::Recv {
        v: API_VERSION,
        service: Some(shared.cfg.service.clone()),
    };
    api::write_json(&mut s, &req).await?;
    info!(service = %shared.cfg.service, "receiving bundles from hopd");
    loop {
        let Some(frame) = api::read_frame(&mut s).await? else {
            return Ok(());
        };
        let (flow, from, size) = match api::parse_reply(&frame)? {
            Reply::File {
                flow, from, size, ..
            } => (flow, from, size),
            Reply::Error { message, .. } => return Err(std::io::Error::other(message)),
            _ => continue,
        };
        let mut data = Vec::with_capacity(size.min(64 << 20) as usize);
        loop {
            let chunk = api::read_frame(&mut s)
                .await?
                .ok_or_else(|| std::io::Error::other("hopd closed during a file"))?;
            if chunk.is_empty() {
                break;
            }
            data.extend_from_slice(&chunk);
        }
        if data.len() as u64 != size {
            return Err(std::io::Error::other(format!(
                "file {flow}: {} bytes, announced {size}",
                data.len()
            )));
        }
        to_dtnd(shared, &flow, from, data).await;
        api::write_json(
            &mut s,
            &Request::Ack {
                v: API_VERSION,
                flow,
            },
        )
        .await?;
    }
}

/// Hands a received bundle to dtnd once; returns when it may be acknowledged to hopd.
async fn to_dtnd(shared: &Arc<Shared>, flow: &str, from: u32, data: Vec<u8>) {
    let info = match inspect(&data, unix_ms_now()) {
        Ok(i) => i,
        Err(e) => {
            let p = shared.dir("rejected").join(flow.replace(':', "-"));
            warn!(%flow, from, error = %e, path = %p.display(), "a file for the bundle service is not a bundle; kept aside");
            if let Err(e) = write_durably(&p, &data) {
                warn!(error = %e, "could not keep it");
            }
            shared.count(|c| c.not_bundles += 1);
            return;
        }
    };
    if shared.delivered.lock().unwrap().contains(&info.id, now_s()) {
        info!(bundle = %info.id, from, "bundle already handed to dtnd; this copy is dropped");
        shared.count(|c| c.duplicates_from_hop += 1);
        return;
    }
    let mut rx = shared.ecla.subscribe();
    let mut waited = false;
    loop {
        let link = rx.borrow_and_update().clone();
        if let Some(link) = link {
            let p = Packet::ForwardData(ForwardData {
                src: from.to_string(),
                dst: String::new(),
                bundle_id: info.id.clone(),
                data: data.clone(),
            });
            if link.send(p).await {
                break;
            }
        } else if !waited {
            info!(bundle = %info.id, "waiting for dtnd to hand over a received bundle");
            waited = true;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
    let expires = now_s() + info.remaining.as_secs() + JOURNAL_MARGIN_S;
    if let Err(e) = shared.delivered.lock().unwrap().insert(&info.id, expires) {
        warn!(error = %e, "could not record a delivered bundle; a second copy would reach dtnd (which drops a bundle it still stores)");
    }
    shared.count(|c| c.to_dtnd += 1);
    debug!(bundle = %info.id, from, bytes = data.len(), "bundle handed to dtnd");
}
