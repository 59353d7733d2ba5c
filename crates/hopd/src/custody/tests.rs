use super::*;

fn block(n: u32, len: usize) -> StoredBlock {
    StoredBlock {
        flow: FlowKey { src: 1, id: 0xabc },
        dst: 4,
        block_num: n,
        offset: u64::from(n) * 1000,
        fin: n == 2,
        data: Bytes::from(vec![n as u8; len]),
    }
}

/// Wait for the writer to report `n` finished writes.
fn finished(done: &CustodyDone, n: usize) -> Vec<(FlowKey, u32, bool)> {
    let mut got = Vec::new();
    for _ in 0..500 {
        got.extend(done.take());
        if got.len() >= n {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    got
}

#[test]
fn writer_thread_persists_later_and_releases_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>> = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(dir.path(), 2500, usage.clone()).unwrap();
    let (mut s, done) = s.with_writer(false).unwrap();
    assert_eq!(s.persist(&block(0, 1000)), Ok(Persist::Later));
    assert_eq!(s.persist(&block(1, 1000)), Ok(Persist::Later));
    // Both count against the limit while they are written.
    assert_eq!(s.persist(&block(2, 1000)), Err(StoreFull));
    // Released while (possibly) still being written: deleted after its write.
    s.release(FlowKey { src: 1, id: 0xabc }, 0);
    let flow = FlowKey { src: 1, id: 0xabc };
    let mut got = finished(&done, 2);
    got.sort_by_key(|(_, b, _)| *b);
    assert_eq!(got, vec![(flow, 0, true), (flow, 1, true)]);
    {
        // Both writes timed, from the hand-over to the store (before `done` saw them).
        let u = usage.lock().unwrap();
        assert_eq!(u.writes_timed, 2);
        assert!(u.write_wait_max_us > 0 && u.write_wait_us >= u.write_wait_max_us);
    }
    // Written: asking again is answered at once.
    assert_eq!(s.persist(&block(1, 1000)), Ok(Persist::Done));
    drop(s);
    let usage = std::sync::Arc::default();
    let (_, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
    assert_eq!(restored, vec![block(1, 1000)]);
}

/// With a write delay a block is acknowledged at once; one released within the delay never
/// reaches the disk, one still held after it does, and what is still held when the store is
/// dropped (a clean shutdown) is written then. Delayed blocks count against the limit.
#[test]
fn a_write_delay_acknowledges_at_once_and_writes_only_blocks_still_held() {
    let dir = tempfile::tempdir().unwrap();
    let usage = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(dir.path(), 3500, usage).unwrap();
    let (s, done) = s.with_writer(false).unwrap();
    let mut s = s.with_write_delay(Duration::from_millis(300));
    let flow = FlowKey { src: 1, id: 0xabc };
    let on_disk = || {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(s.persist(&block(0, 1000)), Ok(Persist::Done));
    assert_eq!(s.persist(&block(1, 1000)), Ok(Persist::Done));
    assert_eq!(s.persist(&block(0, 1000)), Ok(Persist::Done));
    assert_eq!(s.persist(&block(3, 1000)), Ok(Persist::Done));
    assert_eq!(s.persist(&block(4, 1000)), Err(StoreFull));
    // Block 0 moves on within the delay: never written.
    s.release(flow, 0);
    std::thread::sleep(Duration::from_millis(100));
    assert!(on_disk().is_empty(), "{:?}", on_disk());
    // After the delay the blocks still held are on disk (not while one is still a
    // temporary file).
    let mut written = Vec::new();
    for _ in 0..200 {
        written = on_disk();
        if written == vec![file_name(flow, 1), file_name(flow, 3)] {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        written,
        vec![file_name(flow, 1), file_name(flow, 3)],
        "blocks 1 and 3 after the delay"
    );
    // Nobody waits for these writes: nothing is reported to the transport.
    assert!(done.take().is_empty());
    // Released after its write: deleted. One taken just before the shutdown is written.
    s.release(flow, 3);
    assert_eq!(s.persist(&block(5, 1000)), Ok(Persist::Done));
    drop(s);
    let usage = std::sync::Arc::default();
    let (_, restored) = DiskCustody::open(dir.path(), 3500, usage).unwrap();
    assert_eq!(restored, vec![block(1, 1000), block(5, 1000)]);
}

#[test]
fn writer_reports_a_failed_write() {
    let dir = tempfile::tempdir().unwrap();
    let usage = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(dir.path(), 1 << 20, usage).unwrap();
    let (mut s, done) = s.with_writer(false).unwrap();
    // The directory disappears under the store: the write fails and is reported.
    std::fs::remove_dir_all(dir.path()).unwrap();
    assert_eq!(s.persist(&block(0, 100)), Ok(Persist::Later));
    let flow = FlowKey { src: 1, id: 0xabc };
    assert_eq!(finished(&done, 1), vec![(flow, 0, false)]);
}

#[test]
fn persist_restore_release_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let usage = std::sync::Arc::default();
    let (mut s, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
    assert!(restored.is_empty());
    s.persist(&block(0, 1000)).unwrap();
    s.persist(&block(1, 1000)).unwrap();
    assert_eq!(s.persist(&block(2, 1000)), Err(StoreFull));
    drop(s);
    let usage = std::sync::Arc::default();
    let (mut s, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
    assert_eq!(restored, vec![block(0, 1000), block(1, 1000)]);
    s.release(FlowKey { src: 1, id: 0xabc }, 0);
    s.persist(&block(2, 1000)).unwrap();
    drop(s);
    let usage = std::sync::Arc::default();
    let (_, restored) = DiskCustody::open(dir.path(), 2500, usage).unwrap();
    assert_eq!(restored, vec![block(1, 1000), block(2, 1000)]);
}

fn delivery(n: u32, data: &[u8], fin: bool) -> Delivery {
    Delivery {
        flow: FlowKey { src: 3, id: 0x1234 },
        block_num: n,
        offset: u64::from(n) * 1000,
        fin,
        data: Bytes::copy_from_slice(data),
    }
}

/// Wait until the spool's writer reports `n` durable deliveries.
fn durable(done: &CustodyDone, n: usize) -> Vec<(FlowKey, u32, bool)> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while got.len() < n && std::time::Instant::now() < deadline {
        got.extend(done.take_delivered());
        std::thread::sleep(Duration::from_millis(5));
    }
    got
}

/// With a writer thread the destination's deliveries leave the event loop: taken at once
/// (`Persist::Later`), reported once durable, in order; bytes and progress on disk then are
/// the same as when written synchronously, and an abandoned flow still frees its files and
/// budget behind the writes queued before it.
#[test]
fn deliveries_written_off_the_event_loop_are_reported_once_durable() {
    let dir = tempfile::tempdir().unwrap();
    let incoming = dir.path().join("incoming");
    let flow = FlowKey { src: 3, id: 0x1234 };
    let usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>> = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(&dir.path().join("custody"), 10_000, usage.clone()).unwrap();
    let (s, _) = s.with_spool(&incoming, Duration::from_secs(60)).unwrap();
    let (mut s, done) = s.with_writer(true).unwrap();
    let blocks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; 1000]).collect();
    for (n, b) in blocks.iter().enumerate() {
        let d = delivery(n as u32, b, n == 2);
        assert_eq!(s.deliver(&d), Ok(Persist::Later));
    }
    assert_eq!(
        durable(&done, 3),
        vec![(flow, 0, true), (flow, 1, true), (flow, 2, true)]
    );
    assert_eq!(
        std::fs::read(part_path(&incoming, flow)).unwrap(),
        blocks.concat()
    );
    let p = read_state(&state_path(&incoming, flow), flow).unwrap();
    assert!(p.finished);
    assert_eq!((p.next_block, p.bytes), (3, 3000));
    {
        let u = usage.lock().unwrap();
        assert_eq!(u.deliveries_timed, 3);
        assert_eq!(
            u.incoming_bytes, 0,
            "the finished file is the inbox's to count"
        );
    }
    // A second flow, abandoned behind its queued deliveries.
    let other = FlowKey { src: 4, id: 7 };
    for n in 0..2u32 {
        let d = Delivery {
            flow: other,
            ..delivery(n, &[9u8; 1000], false)
        };
        assert_eq!(s.deliver(&d), Ok(Persist::Later));
    }
    s.abandon(other);
    drop(s);
    assert!(!part_path(&incoming, other).exists());
    assert!(!state_path(&incoming, other).exists());
    assert_eq!(usage.lock().unwrap().incoming_bytes, 0);
}

#[test]
fn deliveries_are_durable_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let incoming = dir.path().join("incoming");
    let usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>> = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(&dir.path().join("custody"), 2500, usage.clone()).unwrap();
    let (mut s, progress) = s.with_spool(&incoming, Duration::from_secs(60)).unwrap();
    assert!(progress.is_empty());
    let (a, b, c) = (vec![1u8; 1000], vec![2u8; 1000], vec![3u8; 1000]);
    assert_eq!(s.deliver(&delivery(0, &a, false)), Ok(Persist::Done));
    s.deliver(&delivery(1, &b, false)).unwrap();
    // The third block would exceed the budget: refused and counted, nothing written.
    assert_eq!(s.deliver(&delivery(2, &c, true)), Err(StoreFull));
    {
        let u = usage.lock().unwrap();
        assert!(u.spool_full);
        assert_eq!(u.spool_full_events, 1);
        assert_eq!(u.incoming_bytes, 2000);
        // The two written deliveries are timed; the refused one wrote nothing.
        assert_eq!(u.deliveries_timed, 2);
        assert!(u.deliver_us >= u.deliver_max_us);
    }
    // A restart reads the progress back.
    drop(s);
    let usage2: std::sync::Arc<std::sync::Mutex<CustodyUsage>> = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(&dir.path().join("custody"), 3000, usage2.clone()).unwrap();
    let (mut s, progress) = s.with_spool(&incoming, Duration::from_secs(60)).unwrap();
    let flow = FlowKey { src: 3, id: 0x1234 };
    assert_eq!(
        progress,
        vec![DestProgress {
            flow,
            next_block: 2,
            bytes: 2000,
            finished: false
        }]
    );
    assert_eq!(usage2.lock().unwrap().incoming_bytes, 2000);
    s.deliver(&delivery(2, &c, true)).unwrap();
    assert_eq!(usage2.lock().unwrap().incoming_bytes, 0);
    let part = std::fs::read(part_path(&incoming, flow)).unwrap();
    assert_eq!(part, [a, b, c].concat());
    let p = read_state(&state_path(&incoming, flow), flow).unwrap();
    assert!(p.finished);
    assert_eq!((p.next_block, p.bytes), (3, 3000));
}

#[test]
fn torn_state_record_falls_back_to_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut sp = Spool::new(dir.path()).unwrap();
    let flow = FlowKey { src: 3, id: 0x1234 };
    sp.deliver(&delivery(0, &[7u8; 10], false)).unwrap();
    sp.deliver(&delivery(1, &[8u8; 10], false)).unwrap();
    drop(sp);
    // Corrupt the newest slot (seq 2 lives in slot 0).
    let path = state_path(dir.path(), flow);
    let mut v = std::fs::read(&path).unwrap();
    v[14] ^= 0xff;
    std::fs::write(&path, &v).unwrap();
    let p = read_state(&path, flow).unwrap();
    assert_eq!(p.next_block, 1);
    assert_eq!(Spool::new(dir.path()).unwrap().load(Duration::ZERO), vec![]);
    assert!(!path.exists(), "expired progress is deleted");
}

/// An incoming flow given up unfinished: its files go, and so do its bytes from the
/// disk budget, whether it was delivered to in this run or restored from an earlier one.
#[test]
fn an_abandoned_flow_frees_its_files_and_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let incoming = dir.path().join("incoming");
    let flow = FlowKey { src: 3, id: 0x1234 };
    let usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>> = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(&dir.path().join("custody"), 2500, usage.clone()).unwrap();
    let (mut s, _) = s.with_spool(&incoming, Duration::from_secs(60)).unwrap();
    s.deliver(&delivery(0, &[1u8; 1000], false)).unwrap();
    s.deliver(&delivery(1, &[2u8; 1000], false)).unwrap();
    assert_eq!(usage.lock().unwrap().incoming_bytes, 2000);
    s.abandon(flow);
    assert_eq!(usage.lock().unwrap().incoming_bytes, 0);
    assert!(!part_path(&incoming, flow).exists());
    assert!(!state_path(&incoming, flow).exists());
    // The whole budget is there for the next flow.
    s.deliver(&delivery(0, &[3u8; 1000], false)).unwrap();
    s.deliver(&delivery(1, &[4u8; 1000], false)).unwrap();
    // Restored after a restart, then abandoned before any new delivery.
    drop(s);
    let usage: std::sync::Arc<std::sync::Mutex<CustodyUsage>> = std::sync::Arc::default();
    let (s, _) = DiskCustody::open(&dir.path().join("custody"), 2500, usage.clone()).unwrap();
    let (mut s, progress) = s.with_spool(&incoming, Duration::from_secs(60)).unwrap();
    assert_eq!(progress.len(), 1);
    assert_eq!(usage.lock().unwrap().incoming_bytes, 2000);
    s.abandon(flow);
    assert_eq!(usage.lock().unwrap().incoming_bytes, 0);
    assert!(!part_path(&incoming, flow).exists());
}

/// Start-up keeps a finished flow's file however old its record, so that it is verified
/// and moved to the inbox; pruning at run time deletes only finished flows' records.
#[test]
fn old_records_of_finished_or_live_flows_keep_their_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut sp = Spool::new(dir.path()).unwrap();
    let done = FlowKey { src: 3, id: 0x1234 };
    let live = FlowKey { src: 4, id: 0x1 };
    sp.deliver(&delivery(0, &[7u8; 10], true)).unwrap();
    sp.deliver(&Delivery {
        flow: live,
        ..delivery(0, &[8u8; 10], false)
    })
    .unwrap();
    // At run time nothing of either goes (records older than zero seconds).
    sp.prune_finished(Duration::ZERO);
    assert!(state_path(dir.path(), live).exists() && part_path(dir.path(), live).exists());
    assert!(state_path(dir.path(), done).exists() && part_path(dir.path(), done).exists());
    // Once the finished file is in the inbox, its record can go; the live one stays.
    std::fs::remove_file(part_path(dir.path(), done)).unwrap();
    sp.prune_finished(Duration::ZERO);
    assert!(!state_path(dir.path(), done).exists());
    assert!(state_path(dir.path(), live).exists());
    // At start-up an old finished flow whose file is still here is kept ...
    sp.deliver(&delivery(0, &[7u8; 10], true)).unwrap();
    drop(sp);
    let got = Spool::new(dir.path()).unwrap().load(Duration::ZERO);
    assert_eq!(
        got.iter().map(|p| (p.flow, p.finished)).collect::<Vec<_>>(),
        vec![(done, true)]
    );
    assert!(part_path(dir.path(), done).exists());
    // ... while an unfinished one that old is gone (its source gave up meanwhile).
    assert!(!part_path(dir.path(), live).exists());
}
