//! What became of each transfer (hopd's events), and failed bundles given back to dtnd.

use super::*;

/// The outcome of a transfer, from hopd's events.
pub(super) async fn events_task(shared: Arc<Shared>) {
    let mut first = true;
    loop {
        if let Err(e) = follow_events(&shared, first).await {
            debug!(error = %e, "hopd's event stream ended");
        }
        first = false;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn follow_events(shared: &Arc<Shared>, first: bool) -> std::io::Result<()> {
    let mut s = UnixStream::connect(&shared.cfg.hopd_socket).await?;
    api::write_json(&mut s, &Request::Events { v: API_VERSION }).await?;
    if !first {
        // Events may have been missed while the stream was down.
        reconcile(shared).await?;
    }
    while let Some(frame) = api::read_frame(&mut s).await? {
        let v: serde_json::Value = serde_json::from_slice(&frame)?;
        let kind = v["event"].as_str().unwrap_or("");
        let key = || -> Option<(u32, String)> {
            Some((
                u32::try_from(v["to"].as_u64()?).ok()?,
                v["name"].as_str()?.to_string(),
            ))
        };
        match kind {
            "complete" => {
                let Some(k) = key() else { continue };
                let Some(o) = shared.open.lock().unwrap().remove(&k) else {
                    continue;
                };
                let _ = std::fs::remove_file(&o.copy);
                shared.count(|c| c.hop_complete += 1);
                info!(bundle = %o.id, node = k.0, "bundle delivered to its Hop node");
            }
            "failed" | "cancelled" => {
                let Some(k) = key() else { continue };
                let Some(o) = shared.open.lock().unwrap().remove(&k) else {
                    continue;
                };
                let reason = v["reason"].as_str().unwrap_or("cancelled (`hop cancel`)");
                shared.count(|c| c.hop_failed += 1);
                let data = std::fs::read(&o.copy).unwrap_or_default();
                if inspect(&data, unix_ms_now()).is_ok_and(|i| i.remaining.is_zero()) {
                    info!(bundle = %o.id, "lifetime ended during the transfer; dropped");
                    shared.count(|c| c.expired += 1);
                    let _ = std::fs::remove_file(&o.copy);
                    continue;
                }
                warn!(bundle = %o.id, node = k.0, %reason, "transfer failed");
                // The bundle may be sent to that node again.
                let _ = shared
                    .sent
                    .lock()
                    .unwrap()
                    .remove(&format!("{} {}", k.0, o.id));
                failed(shared, &o.id, &o.copy, data).await;
            }
            "lagged" => reconcile(shared).await?,
            _ => {}
        }
    }
    Ok(())
}

/// Open transfers hopd no longer lists ended unseen: outcome unknown.
async fn reconcile(shared: &Arc<Shared>) -> std::io::Result<()> {
    let listed = hopd_list(&shared.cfg.hopd_socket).await?;
    let gone: Vec<((u32, String), Open)> = {
        let mut open = shared.open.lock().unwrap();
        let keys: Vec<(u32, String)> = open
            .iter()
            .filter(|(k, o)| o.queued && !listed.iter().any(|f| f.to == k.0 && f.name == k.1))
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| open.remove(&k).map(|o| (k, o)))
            .collect()
    };
    for ((node, _), o) in gone {
        shared.count(|c| c.outcome_unknown += 1);
        warn!(bundle = %o.id, node, "its transfer ended while hop-dtn was not following hopd's events; the copy is in unresolved/");
        keep(shared, &o.copy, "unresolved", "outcome unknown");
    }
    Ok(())
}

/// A bundle whose transfer failed: back to dtnd, whose routing decides again, or kept.
pub(super) async fn failed(shared: &Arc<Shared>, id: &str, copy: &Path, data: Vec<u8>) {
    if shared.cfg.hand_back && !data.is_empty() {
        match hand_back(shared.cfg.dtnd, id, &data).await {
            Ok(()) => {
                shared.count(|c| c.handed_back += 1);
                info!(bundle = %id, "given back to dtnd to be routed again");
                let _ = std::fs::remove_file(copy);
                return;
            }
            Err(e) => warn!(bundle = %id, error = %e, "could not give the bundle back to dtnd"),
        }
    }
    shared.count(|c| c.kept_failed += 1);
    keep(shared, copy, "failed", "transfer failed");
    warn!(bundle = %id, dir = %shared.dir("failed").display(), "bundle kept in failed/ (dtnd can take it again: dtnsend --raw, or POST /insert)");
}

/// dtnd's HTTP API: `GET /delete?<id>` (so the bundle is new to it again), then
/// `POST /insert` with the bundle, which dtnd dispatches as if sent locally.
async fn hand_back(dtnd: std::net::SocketAddr, id: &str, data: &[u8]) -> Result<(), String> {
    // dtnd reads the raw query as the id; one that needs escaping cannot be named.
    if id
        .bytes()
        .all(|b| b.is_ascii_graphic() && !b"#%&+".contains(&b))
    {
        let (code, _) = http(dtnd, "GET", &format!("/delete?{id}"), &[]).await?;
        if code != 200 && code != 404 {
            return Err(format!("dtnd answered {code} to the deletion"));
        }
    }
    let (code, body) = http(dtnd, "POST", "/insert", data).await?;
    if code != 200 {
        return Err(format!(
            "dtnd answered {code} to the insertion: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(())
}

/// One HTTP/1.1 request to dtnd's local API (`Connection: close`): status and body.
async fn http(
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), String> {
    let go = async {
        let mut s = TcpStream::connect(addr).await?;
        let head = format!(
            "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await?;
        Ok::<_, std::io::Error>(resp)
    };
    let resp = tokio::time::timeout(Duration::from_secs(30), go)
        .await
        .map_err(|_| "dtnd's HTTP API did not answer in 30 s".to_string())?
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&resp[..resp.len().min(64)]);
    let code = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let body = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(Vec::new(), |i| resp[i + 4..].to_vec());
    Ok((code, body))
}
