use super::*;
use hop_proto::FlowKey;
use std::time::Duration;

/// A sending client killed while its window is full must still abort its flow (else it
/// stays open, counted against `max_flows`, until the daemon restarts).
#[tokio::test]
async fn a_sender_gone_while_its_window_is_full_aborts_its_flow() {
    let (mut client, server) = UnixStream::pair().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let size = 10 * DATA_CHUNK as u64;
    let task = tokio::spawn(send(server, tx, SendReq::file("f.bin", size)));
    let (flow, _updates) = accept_open(&mut rx, &mut client, 7, 0).await;
    // One frame more than the window: the server holds one back and queues the rest.
    for _ in 0..=SEND_WINDOW {
        api::write_frame(&mut client, &[7u8; 1024]).await.unwrap();
    }
    let mut done = Vec::new();
    while done.len() < SEND_WINDOW {
        match rx.recv().await {
            Some(Cmd::Data { done: d, .. }) => done.push(d),
            _ => panic!("expected data"),
        }
    }
    drop(client);
    done.remove(0).send(()).unwrap();
    // The server notices either way: the wait sees the client gone, or the progress
    // write fails.
    let _ = task.await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match rx.recv().await {
                Some(Cmd::Abort { flow }) => return Some(flow),
                Some(_) => continue,
                None => return None,
            }
        }
    })
    .await
    .expect("no abort");
    assert_eq!(got, Some(flow));
}

/// Progress reports carry the file bytes the destination acknowledged end to end (the
/// flow's acknowledged prefix less the header), also while the client waits for the end.
#[tokio::test]
async fn progress_reports_what_the_destination_acknowledged() {
    let (mut client, server) = UnixStream::pair().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let size = 3000u64;
    let task = tokio::spawn(send(server, tx, SendReq::file("f.bin", size)));
    let (_flow, updates) = accept_open(&mut rx, &mut client, 9, 0).await;
    api::write_frame(&mut client, &[1u8; 3000]).await.unwrap();
    api::write_frame(&mut client, &[]).await.unwrap();
    let Some(Cmd::Data { done, last, .. }) = rx.recv().await else {
        panic!("expected data");
    };
    assert!(last);
    done.send(()).unwrap();
    let header = FlowHeader {
        name: "f.bin".into(),
        size,
        service: None,
    }
    .encode()
    .len() as u64;
    assert_eq!(
        reply_of(&mut client).await,
        Reply::Progress {
            bytes: 3000,
            acked: None
        }
    );
    updates
        .send(FlowUpdate::Acked {
            bytes: header + 500,
        })
        .unwrap();
    assert_eq!(
        reply_of(&mut client).await,
        Reply::Progress {
            bytes: 3000,
            acked: Some(500)
        }
    );
    updates.send(FlowUpdate::Complete { bytes: 0 }).unwrap();
    assert!(matches!(
        reply_of(&mut client).await,
        Reply::Complete { .. }
    ));
    task.await.unwrap().unwrap();
}

/// The core's side of a send's start: take the `Open`, answer with flow `id`, and read
/// the `accepted` reply the client gets. Returns the flow and the client's update channel.
async fn accept_open(
    rx: &mut mpsc::Receiver<Cmd>,
    client: &mut UnixStream,
    id: u32,
    first_bytes: usize,
) -> (FlowKey, mpsc::UnboundedSender<FlowUpdate>) {
    let Some(Cmd::Open { reply, updates, .. }) = rx.recv().await else {
        panic!("no open");
    };
    let flow = FlowKey { src: 1, id };
    reply.send(Ok(Opened { flow, first_bytes })).unwrap();
    assert!(matches!(reply_of(client).await, Reply::Accepted { .. }));
    (flow, updates)
}

async fn reply_of(client: &mut UnixStream) -> Reply {
    api::parse_reply(&api::read_frame(client).await.unwrap().unwrap()).unwrap()
}

/// Runs `send` for a file of `frames` (written one data frame each) with the daemon's
/// `first_bytes`, acknowledging every hand-over; returns the lengths handed to the
/// transport and the header's length.
async fn hand_overs(first_bytes: usize, frames: &[usize]) -> (Vec<usize>, usize) {
    let (mut client, server) = UnixStream::pair().unwrap();
    let (tx, mut rx) = mpsc::channel(16);
    let size: usize = frames.iter().sum();
    let task = tokio::spawn(send(server, tx, SendReq::file("f.bin", size as u64)));
    let _ = accept_open(&mut rx, &mut client, 7, first_bytes).await;
    let frames = frames.to_vec();
    let writer = tokio::spawn(async move {
        for (i, n) in frames.iter().enumerate() {
            api::write_frame(&mut client, &vec![i as u8; *n])
                .await
                .unwrap();
        }
        api::write_frame(&mut client, &[]).await.unwrap();
        client // keep it open until the end
    });
    let mut lens = Vec::new();
    loop {
        match rx.recv().await {
            Some(Cmd::Data {
                data, done, last, ..
            }) => {
                lens.push(data.len());
                let _ = done.send(());
                if last {
                    break;
                }
            }
            _ => panic!("expected data"),
        }
    }
    // The finish rides with the last bytes: nothing follows them.
    let more = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
    assert!(
        !matches!(more, Ok(Some(Cmd::Data { .. }))),
        "data after the hand-over marked last"
    );
    let _client = writer.await.unwrap();
    task.abort();
    let header = FlowHeader {
        name: "f.bin".into(),
        size: size as u64,
        service: None,
    }
    .encode()
    .len();
    (lens, header)
}

/// Hop cuts a block from what the source holds, so the first hand-over gathers a block's
/// worth of the file: the first block is full, not one frame long.
#[tokio::test]
async fn the_first_hand_over_gathers_first_bytes_of_the_file() {
    let (lens, h) = hand_overs(4096, &[1024; 7]).await;
    // Header + 4 frames, then one frame at a time, the last with the 32-byte hash.
    assert_eq!(lens, vec![h + 4096, 1024, 1024, 1024 + 32]);
    // Frames that overshoot: the first hand-over holds at least first_bytes.
    let (lens, h) = hand_overs(4096, &[3000, 3000, 3000]).await;
    assert_eq!(lens, vec![h + 6000, 3000 + 32]);
}

#[tokio::test]
async fn a_file_smaller_than_first_bytes_goes_in_one_hand_over() {
    let (lens, h) = hand_overs(1 << 20, &[1024, 1024, 100]).await;
    assert_eq!(lens, vec![h + 2148 + 32]);
}

/// Without `first_bytes` (HxH, ATP) the first frame rides with the header alone.
#[tokio::test]
async fn without_first_bytes_frames_are_handed_over_one_by_one() {
    let (lens, h) = hand_overs(0, &[1024, 1024, 1024]).await;
    assert_eq!(lens, vec![h + 1024, 1024, 1024 + 32]);
}
