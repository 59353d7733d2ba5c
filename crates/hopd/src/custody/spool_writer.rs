//! The destination's deliveries written off the event loop: a thread owns the [`Spool`],
//! writes each block handed to it at its offset, and makes a batch durable with one fsync of
//! each flow's file and one progress record per flow. Each block's write is reported
//! through [`CustodyDone`] once durable; the transport then sends the end-to-end BACK that
//! covers it (the source drops its copy only then, §3.2), and ends the flow for the
//! application after its last block. A write that fails is retried, backing off, until it
//! succeeds or the flow is abandoned: the bytes stay in memory meanwhile and nothing is
//! acknowledged, so a disk error never loses a delivery.

use std::collections::VecDeque;
use std::time::Instant;

use super::*;

/// What the event loop hands the spool's thread, in order.
pub(super) enum SpoolJob {
    /// A block delivered in order, to write and make durable.
    Deliver { d: Delivery, queued: Instant },
    /// The flow ended unfinished: delete its files once what was queued before is done.
    Abandon(FlowKey),
}

/// The spool's thread.
pub(super) struct SpoolWriter {
    jobs: Option<mpsc::Sender<SpoolJob>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SpoolWriter {
    pub(super) fn start(
        spool: Spool,
        done: Arc<CustodyDone>,
        usage: Arc<Mutex<CustodyUsage>>,
    ) -> std::io::Result<SpoolWriter> {
        let (tx, rx) = mpsc::channel::<SpoolJob>();
        let thread = std::thread::Builder::new()
            .name("hopd-spool".into())
            .spawn(move || spool_loop(spool, &rx, &done, &usage))?;
        Ok(SpoolWriter {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    pub(super) fn send(&self, job: SpoolJob) -> std::io::Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| std::io::Error::other("spool writer stopped"))
    }
}

impl Drop for SpoolWriter {
    fn drop(&mut self) {
        // Finish what is queued: a clean shutdown leaves every delivery it took on disk.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Longest wait between two tries of a failing write.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Jobs waiting while a write is retried, and whether the event loop's side is gone.
struct Queue<'a> {
    rx: &'a mpsc::Receiver<SpoolJob>,
    backlog: VecDeque<SpoolJob>,
    closed: bool,
}

impl Queue<'_> {
    /// Run `op` until it succeeds. False if it was given up: the flow was abandoned
    /// meanwhile, or the store closed while the disk still failed.
    fn retry(
        &mut self,
        (flow, block): (FlowKey, u32),
        shared: (&CustodyDone, &Mutex<CustodyUsage>),
        mut op: impl FnMut() -> std::io::Result<()>,
    ) -> bool {
        let (done, usage) = shared;
        let mut wait = Duration::from_millis(100);
        let mut failing = false;
        loop {
            match op() {
                Ok(()) => {
                    if failing {
                        info!(%flow, "spool writes succeed again");
                        if let Ok(mut u) = usage.lock() {
                            u.spool_write_failing = false;
                        }
                    }
                    return true;
                }
                Err(e) => {
                    if !failing {
                        warn!(%flow, error = %e, "spool write failed: retrying; the end-to-end acknowledgement waits");
                        if let Ok(mut u) = usage.lock() {
                            u.spool_write_failing = true;
                            u.spool_full_events += 1;
                        }
                        // The transport tells the source its destination cannot store.
                        if let Ok(mut d) = done.delivered.lock() {
                            d.push((flow, block, false));
                        }
                        done.notify.notify_one();
                        failing = true;
                    }
                }
            }
            if self.closed {
                return false;
            }
            match self.rx.recv_timeout(wait) {
                Ok(job) => self.backlog.push_back(job),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => self.closed = true,
            }
            self.backlog.extend(self.rx.try_iter());
            if self
                .backlog
                .iter()
                .any(|j| matches!(j, SpoolJob::Abandon(f) if *f == flow))
            {
                return false;
            }
            wait = (wait * 2).min(RETRY_MAX);
        }
    }
}

fn spool_loop(
    mut spool: Spool,
    rx: &mpsc::Receiver<SpoolJob>,
    done: &CustodyDone,
    usage: &Mutex<CustodyUsage>,
) {
    let mut q = Queue {
        rx,
        backlog: VecDeque::new(),
        closed: false,
    };
    loop {
        if q.backlog.is_empty() {
            if q.closed {
                return;
            }
            match rx.recv() {
                Ok(job) => q.backlog.push_back(job),
                Err(_) => return,
            }
        }
        q.backlog.extend(rx.try_iter());
        // One batch: every block written, then one fsync and one record per flow.
        let batch: Vec<SpoolJob> = q.backlog.drain(..).collect();
        let mut written: Vec<(FlowKey, u32, Instant)> = Vec::new();
        let mut commits: Vec<DestProgress> = Vec::new();
        for job in batch {
            match job {
                SpoolJob::Deliver { d, queued } => {
                    if !q.retry((d.flow, d.block_num), (done, usage), || {
                        spool.write_block(&d)
                    }) {
                        continue;
                    }
                    let p = spool::progress_after(&d);
                    match commits.iter_mut().find(|c| c.flow == d.flow) {
                        Some(c) => *c = p,
                        None => commits.push(p),
                    }
                    written.push((d.flow, d.block_num, queued));
                }
                SpoolJob::Abandon(flow) => {
                    commits.retain(|c| c.flow != flow);
                    written.retain(|w| w.0 != flow);
                    let bytes = spool.abandon(flow);
                    info!(%flow, bytes, "incoming flow abandoned: its spool files are deleted");
                    if let Ok(mut u) = usage.lock() {
                        u.incoming_bytes = u.incoming_bytes.saturating_sub(bytes);
                    }
                }
            }
        }
        let mut durable = Vec::with_capacity(written.len());
        for p in commits {
            let last = p.next_block.wrapping_sub(1);
            if q.retry((p.flow, last), (done, usage), || spool.commit(&p)) {
                durable.extend(written.iter().filter(|w| w.0 == p.flow));
            }
        }
        if durable.is_empty() {
            continue;
        }
        if let Ok(mut u) = usage.lock() {
            let now = Instant::now();
            for (_, _, queued) in &durable {
                u.time_delivery(now.saturating_duration_since(*queued));
            }
        }
        if let Ok(mut d) = done.delivered.lock() {
            d.extend(durable.iter().map(|(f, b, _)| (*f, *b, true)));
        }
        done.notify.notify_one();
    }
}
