//! Batched UDP I/O on Linux: `recvmmsg` with UDP GRO on receive, `sendmmsg` with UDP GSO on
//! send.
//!
//! Receiving: one `recvmmsg` call fills up to [`RX_SLOTS`] buffers. With `UDP_GRO` enabled the
//! kernel may hand over several datagrams of one sender coalesced into one buffer, together
//! with their segment size; [`RxBatch::datagrams`] splits them again, so callers always see
//! the original datagrams.
//!
//! Sending: datagrams are queued in a [`TxQueue`] in the order the core produced them. A flush
//! sends the longest run of queued datagrams of one class (one socket, so each keeps its DSCP)
//! with one `sendmmsg` call. Within a run, consecutive datagrams to the same address of equal
//! size (the last one may be shorter) form one GSO message (`UDP_SEGMENT`): the kernel cuts it
//! into the original datagrams, each with its own UDP and IP header. No `IP_TOS` control
//! message is attached, so the socket's TOS byte (DSCP) applies to every segment. If the
//! kernel or the device refuses GSO, the queue falls back to one datagram per message.
//!
//! A partial send (the kernel took the first k messages) or `WouldBlock` in the middle of a
//! batch keeps the rest queued in order; nothing is sent twice.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// `SOL_UDP` socket option level.
const SOL_UDP: libc::c_int = 17;
/// `UDP_SEGMENT` (linux/udp.h): GSO segment size of a send.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): coalesce received datagrams; the cmsg carries the segment size.
const UDP_GRO: libc::c_int = 104;
/// Most segments the kernel accepts in one GSO send (`UDP_MAX_SEGMENTS`).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Largest UDP payload of one IPv4 datagram, the bound of a GSO send's total size.
const MAX_GSO_BYTES: usize = 65507;
/// Receive buffers filled by one `recvmmsg`.
pub const RX_SLOTS: usize = 32;
/// Bytes of one receive buffer: a whole coalesced GRO message, or the largest datagram.
pub const RX_SLOT_BYTES: usize = 65536;
/// Messages (GSO or single datagrams) per `sendmmsg`.
pub const TX_MSGS: usize = 64;
/// Datagrams (iovecs) per `sendmmsg`.
pub const TX_SEGMENTS: usize = 256;
/// Bytes of control-message space per message (one `int` cmsg, aligned).
const CMSG_BYTES: usize = 32;

/// Enable `UDP_GRO` on a socket; false if the kernel does not offer it (then every datagram
/// arrives on its own, which [`RxBatch`] handles the same way).
pub fn enable_gro(fd: RawFd) -> bool {
    set_int_option(fd, SOL_UDP, UDP_GRO, 1) == 0
}

/// `setsockopt` with an int value; returns its result (0, or -1 with errno set).
pub fn set_int_option(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> libc::c_int {
    // SAFETY: setsockopt with a correctly sized int value; a bad descriptor is an error, not UB.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    }
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: `ss` is a sockaddr_storage written by the kernel with `len` valid bytes.
    let addr = unsafe { socket2::SockAddr::new(*ss, len) };
    addr.as_socket()
}

/// Receive buffers for one `recvmmsg` and what it returned.
pub struct RxBatch {
    buf: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    addr_lens: Vec<libc::socklen_t>,
    /// Control-message space, u64 for the alignment `cmsghdr` needs.
    cmsgs: Vec<[u64; CMSG_BYTES / 8]>,
    lens: Vec<usize>,
    /// GRO segment size of each slot; 0: the slot is one datagram.
    segs: Vec<usize>,
    truncated: Vec<bool>,
    filled: usize,
}

impl Default for RxBatch {
    fn default() -> Self {
        RxBatch::new()
    }
}

impl RxBatch {
    pub fn new() -> RxBatch {
        RxBatch {
            buf: vec![0u8; RX_SLOTS * RX_SLOT_BYTES],
            // SAFETY: sockaddr_storage is plain old data; all zero is a valid value.
            addrs: vec![unsafe { std::mem::zeroed() }; RX_SLOTS],
            addr_lens: vec![0; RX_SLOTS],
            cmsgs: vec![[0u64; CMSG_BYTES / 8]; RX_SLOTS],
            lens: vec![0; RX_SLOTS],
            segs: vec![0; RX_SLOTS],
            truncated: vec![false; RX_SLOTS],
            filled: 0,
        }
    }

    /// One non-blocking `recvmmsg` on `fd`; returns the number of messages (each holding one
    /// or, with GRO, several datagrams). `WouldBlock` when nothing is waiting.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.filled = 0;
        // SAFETY: plain old data; every pointer is set below before use.
        let mut iovs: [libc::iovec; RX_SLOTS] = unsafe { std::mem::zeroed() };
        let mut hdrs: [libc::mmsghdr; RX_SLOTS] = unsafe { std::mem::zeroed() };
        for (i, (slot, iov)) in self
            .buf
            .chunks_exact_mut(RX_SLOT_BYTES)
            .zip(iovs.iter_mut())
            .enumerate()
        {
            iov.iov_base = slot.as_mut_ptr() as *mut libc::c_void;
            iov.iov_len = RX_SLOT_BYTES;
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = &mut self.addrs[i] as *mut libc::sockaddr_storage as *mut libc::c_void;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = iov as *mut libc::iovec;
            h.msg_iovlen = 1;
            h.msg_control = self.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = CMSG_BYTES as _;
        }
        // SAFETY: every header points into buffers owned by `self` (or the local iovec
        // array), all alive for the duration of the call.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                RX_SLOTS as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for (i, hdr) in hdrs.iter().enumerate().take(n) {
            let h = &hdr.msg_hdr;
            self.lens[i] = hdr.msg_len as usize;
            self.addr_lens[i] = h.msg_namelen;
            self.truncated[i] = h.msg_flags & libc::MSG_TRUNC != 0;
            self.segs[i] = gro_segment_size(h);
        }
        self.filled = n;
        Ok(n)
    }

    /// Messages filled by the last [`recv`](Self::recv).
    pub fn len(&self) -> usize {
        self.filled
    }

    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Whether message `i` did not fit its buffer (its datagrams are incomplete).
    pub fn truncated(&self, i: usize) -> bool {
        self.truncated[i]
    }

    /// The sender and the datagrams of message `i` (several if GRO coalesced them).
    pub fn datagrams(&self, i: usize) -> (Option<SocketAddr>, Segments<'_>) {
        let from = sockaddr_to_std(&self.addrs[i], self.addr_lens[i]);
        let start = i * RX_SLOT_BYTES;
        let data = &self.buf[start..start + self.lens[i].min(RX_SLOT_BYTES)];
        (
            from,
            Segments {
                data,
                size: self.segs[i],
                started: false,
            },
        )
    }
}

/// The datagrams of one received message: at least one, which may be empty (a zero-length
/// datagram is a datagram too).
pub struct Segments<'a> {
    data: &'a [u8],
    size: usize,
    started: bool,
}

impl<'a> Iterator for Segments<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        if self.data.is_empty() && std::mem::replace(&mut self.started, true) {
            return None;
        }
        self.started = true;
        let n = if self.size == 0 {
            self.data.len()
        } else {
            self.size.min(self.data.len())
        };
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Some(head)
    }
}

/// The GRO segment size in a received message's control data, 0 if none.
fn gro_segment_size(h: &libc::msghdr) -> usize {
    // SAFETY: the CMSG macros walk the control buffer the kernel filled, bounded by
    // msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let mut v: libc::c_int = 0;
                std::ptr::copy_nonoverlapping(
                    libc::CMSG_DATA(c),
                    &mut v as *mut libc::c_int as *mut u8,
                    std::mem::size_of::<libc::c_int>(),
                );
                return v.max(0) as usize;
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// An outgoing datagram: sealed envelope, destination and class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    pub dest: SocketAddr,
    /// Data class (data socket, DSCP CS1) rather than control (DSCP EF).
    pub data: bool,
    pub payload: Vec<u8>,
}

/// One message of a `sendmmsg` batch: `count` queued datagrams from `start`, sent as GSO
/// segments of `segment` bytes when `count > 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub count: usize,
    pub segment: usize,
}

/// Sends one batch of messages of one class; implemented over the sockets by the daemon and
/// by scripted fakes in tests. Returns how many messages (from the first) were sent, as
/// `sendmmsg` does; an error means the first message was not sent.
pub trait BatchSend {
    fn send_batch(&mut self, data: bool, items: &[Datagram], spans: &[Span]) -> io::Result<usize>;
}

/// What a flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TxStats {
    pub datagrams: u64,
    pub bytes: u64,
    /// Datagrams dropped on a send error other than `WouldBlock`.
    pub errors: u64,
    /// `sendmmsg` calls made.
    pub calls: u64,
}

/// Why a flush stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// The queue is empty.
    Done,
    /// The socket of this class (true: data) is full; the rest stays queued.
    Blocked { data: bool },
}

/// Outgoing datagrams in order, sent in batches.
pub struct TxQueue {
    items: Vec<Datagram>,
    head: usize,
    gso: bool,
    spans: Vec<Span>,
    blocked: Option<bool>,
}

impl TxQueue {
    /// `gso`: group datagrams into GSO messages (turned off for good if the kernel refuses).
    pub fn new(gso: bool) -> TxQueue {
        TxQueue {
            items: Vec::new(),
            head: 0,
            gso,
            spans: Vec::with_capacity(TX_MSGS),
            blocked: None,
        }
    }

    pub fn push(&mut self, d: Datagram) {
        if self.head > 0 && self.head == self.items.len() {
            self.items.clear();
            self.head = 0;
        }
        self.items.push(d);
    }

    pub fn len(&self) -> usize {
        self.items.len() - self.head
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether GSO is still in use.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// The class whose socket was full at the last flush, if it stopped there.
    pub fn blocked(&self) -> Option<bool> {
        self.blocked
    }

    /// Group the run of same-class datagrams at the head into messages.
    fn plan(&mut self) -> bool {
        self.spans.clear();
        let data = self.items[self.head].data;
        let mut i = self.head;
        let mut segments = 0;
        while i < self.items.len()
            && self.items[i].data == data
            && self.spans.len() < TX_MSGS
            && segments < TX_SEGMENTS
        {
            let first = &self.items[i];
            let size = first.payload.len();
            let mut count = 1;
            let mut bytes = size;
            if self.gso && size > 0 {
                while count < MAX_GSO_SEGMENTS && segments + count < TX_SEGMENTS {
                    let Some(next) = self.items.get(i + count) else {
                        break;
                    };
                    let len = next.payload.len();
                    if next.data != data
                        || next.dest != first.dest
                        || len > size
                        || len == 0
                        || bytes + len > MAX_GSO_BYTES
                    {
                        break;
                    }
                    count += 1;
                    bytes += len;
                    if len < size {
                        // A shorter datagram can only be a GSO message's last segment.
                        break;
                    }
                }
            }
            self.spans.push(Span {
                start: i,
                count,
                segment: if count > 1 { size } else { 0 },
            });
            i += count;
            segments += count;
        }
        data
    }

    /// Send queued datagrams until the queue is empty or a socket is full.
    pub fn flush<S: BatchSend>(&mut self, sender: &mut S, stats: &mut TxStats) -> Flush {
        self.blocked = None;
        while self.head < self.items.len() {
            let data = self.plan();
            stats.calls += 1;
            match sender.send_batch(data, &self.items, &self.spans) {
                Ok(sent) => {
                    let taken: usize = self.spans.iter().take(sent).map(|s| s.count).sum();
                    self.consume(taken, stats);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.blocked = Some(data);
                    return Flush::Blocked { data };
                }
                Err(e) => {
                    let span = self.spans[0];
                    let gso_refused = span.count > 1
                        && matches!(
                            e.raw_os_error(),
                            Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::EMSGSIZE)
                        );
                    if gso_refused {
                        // The device or kernel cannot segment: resend one datagram per message.
                        tracing::warn!(error = %e, "UDP GSO refused; sending datagrams one by one");
                        self.gso = false;
                    } else {
                        tracing::debug!(dest = %self.items[span.start].dest, error = %e, "send failed");
                        stats.errors += span.count as u64;
                        self.drop_front(span.count);
                    }
                }
            }
        }
        self.items.clear();
        self.head = 0;
        Flush::Done
    }

    fn consume(&mut self, count: usize, stats: &mut TxStats) {
        for d in &mut self.items[self.head..self.head + count] {
            stats.datagrams += 1;
            stats.bytes += d.payload.len() as u64;
            // Free the payload now; the slot is reused after the queue drains.
            d.payload = Vec::new();
        }
        self.head += count;
    }

    fn drop_front(&mut self, count: usize) {
        for d in &mut self.items[self.head..self.head + count] {
            d.payload = Vec::new();
        }
        self.head += count;
    }
}

/// [`BatchSend`] over two sockets (control and data) with `sendmmsg`.
pub struct MmsgSender {
    pub ctrl: RawFd,
    pub data: RawFd,
}

impl BatchSend for MmsgSender {
    fn send_batch(&mut self, data: bool, items: &[Datagram], spans: &[Span]) -> io::Result<usize> {
        let fd = if data { self.data } else { self.ctrl };
        send_mmsg(fd, items, spans)
    }
}

/// One `sendmmsg` of `spans` (at most [`TX_MSGS`] messages, [`TX_SEGMENTS`] datagrams).
pub fn send_mmsg(fd: RawFd, items: &[Datagram], spans: &[Span]) -> io::Result<usize> {
    let spans = &spans[..spans.len().min(TX_MSGS)];
    // SAFETY: plain old data; the used entries are filled below before the call.
    let mut iovs: [libc::iovec; TX_SEGMENTS] = unsafe { std::mem::zeroed() };
    let mut hdrs: [libc::mmsghdr; TX_MSGS] = unsafe { std::mem::zeroed() };
    let mut cmsgs = [[0u64; CMSG_BYTES / 8]; TX_MSGS];
    let addrs: Vec<socket2::SockAddr> = spans
        .iter()
        .map(|s| socket2::SockAddr::from(items[s.start].dest))
        .collect();
    let mut iov_at = 0;
    let mut msgs = 0;
    for (m, span) in spans.iter().enumerate() {
        if iov_at + span.count > TX_SEGMENTS {
            break;
        }
        for (k, d) in items[span.start..span.start + span.count]
            .iter()
            .enumerate()
        {
            iovs[iov_at + k].iov_base = d.payload.as_ptr() as *mut libc::c_void;
            iovs[iov_at + k].iov_len = d.payload.len();
        }
        let h = &mut hdrs[m].msg_hdr;
        h.msg_name = addrs[m].as_ptr() as *mut libc::c_void;
        h.msg_namelen = addrs[m].len();
        h.msg_iov = &mut iovs[iov_at] as *mut libc::iovec;
        h.msg_iovlen = span.count as _;
        if span.count > 1 {
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space =
                unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as libc::c_uint) } as usize;
            h.msg_control = cmsgs[m].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = space as _;
            // SAFETY: the control buffer is CMSG_BYTES long and aligned for cmsghdr; one
            // cmsg with a u16 fits.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as libc::c_uint) as _;
                let seg = span.segment as u16;
                std::ptr::copy_nonoverlapping(
                    &seg as *const u16 as *const u8,
                    libc::CMSG_DATA(c),
                    std::mem::size_of::<u16>(),
                );
            }
        }
        iov_at += span.count;
        msgs += 1;
    }
    // SAFETY: the headers point at addresses, iovecs, payloads and control buffers that all
    // outlive the call.
    let n = unsafe {
        libc::sendmmsg(
            fd,
            hdrs.as_mut_ptr(),
            msgs as libc::c_uint,
            libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::os::fd::AsRawFd;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Datagram `id` of `len` bytes; the first two bytes carry the id.
    fn dg(id: u16, len: usize, data: bool, port: u16) -> Datagram {
        let mut payload = vec![(id % 251) as u8; len.max(2)];
        payload[..2].copy_from_slice(&id.to_be_bytes());
        Datagram {
            dest: addr(port),
            data,
            payload,
        }
    }

    fn id(p: &[u8]) -> u16 {
        u16::from_be_bytes([p[0], p[1]])
    }

    /// What the fake socket does at each call.
    enum Step {
        /// Take at most this many messages.
        Take(usize),
        Fail(i32),
        WouldBlock,
    }

    #[derive(Default)]
    struct Script {
        steps: VecDeque<Step>,
        /// (class, datagram ids) of each message taken, in order.
        sent: Vec<(bool, Vec<u16>)>,
        calls: Vec<Vec<Span>>,
    }

    impl BatchSend for Script {
        fn send_batch(
            &mut self,
            data: bool,
            items: &[Datagram],
            spans: &[Span],
        ) -> io::Result<usize> {
            self.calls.push(spans.to_vec());
            for s in spans {
                let ds = &items[s.start..s.start + s.count];
                assert!(ds.iter().all(|d| d.data == data && d.dest == ds[0].dest));
            }
            let take = match self.steps.pop_front().unwrap_or(Step::Take(usize::MAX)) {
                Step::Take(k) => k.min(spans.len()),
                Step::Fail(errno) => return Err(io::Error::from_raw_os_error(errno)),
                Step::WouldBlock => return Err(io::ErrorKind::WouldBlock.into()),
            };
            for s in &spans[..take] {
                let ids = items[s.start..s.start + s.count]
                    .iter()
                    .map(|d| id(&d.payload))
                    .collect();
                self.sent.push((data, ids));
            }
            Ok(take)
        }
    }

    fn flat(sent: &[(bool, Vec<u16>)]) -> Vec<u16> {
        sent.iter()
            .flat_map(|(_, ids)| ids.iter().copied())
            .collect()
    }

    #[test]
    fn grouping_follows_class_destination_and_size() {
        let mut q = TxQueue::new(true);
        for i in 0..70 {
            q.push(dg(i, 1400, true, 9000));
        }
        q.push(dg(70, 900, true, 9000)); // shorter: ends the GSO message it joins
        q.push(dg(71, 1400, true, 9000));
        q.push(dg(72, 1400, true, 9001)); // other destination
        q.push(dg(73, 60, false, 9000)); // control class: next call
        q.push(dg(74, 1400, true, 9000));
        let mut s = Script::default();
        let mut st = TxStats::default();
        assert_eq!(q.flush(&mut s, &mut st), Flush::Done);
        assert_eq!(flat(&s.sent), (0..75).collect::<Vec<_>>());
        let sizes: Vec<(bool, usize)> = s.sent.iter().map(|(c, v)| (*c, v.len())).collect();
        // 65507 bytes at most per GSO message (46 of 1400); 46..=70 incl. the shorter one;
        // then singles.
        assert_eq!(
            sizes,
            vec![
                (true, 46),
                (true, 25),
                (true, 1),
                (true, 1),
                (false, 1),
                (true, 1)
            ]
        );
        assert_eq!(s.calls.len(), 3);
        assert_eq!(s.calls[0][0].segment, 1400);
        assert_eq!(st.datagrams, 75);
        assert_eq!(st.calls, 3);
        assert!(q.is_empty());
    }

    #[test]
    fn at_most_64_segments_per_gso_message() {
        let mut q = TxQueue::new(true);
        for i in 0..130 {
            q.push(dg(i, 200, true, 9000));
        }
        let mut s = Script::default();
        let mut st = TxStats::default();
        assert_eq!(q.flush(&mut s, &mut st), Flush::Done);
        let sizes: Vec<usize> = s.sent.iter().map(|(_, v)| v.len()).collect();
        assert_eq!(sizes, vec![64, 64, 2]);
        assert_eq!(flat(&s.sent), (0..130).collect::<Vec<_>>());
    }

    #[test]
    fn partial_sends_and_would_block_keep_the_rest_in_order() {
        let mut q = TxQueue::new(false);
        for i in 0..10 {
            q.push(dg(i, 100 + i as usize, i % 4 != 3, 9000));
        }
        let mut s = Script {
            steps: [Step::Take(1), Step::WouldBlock].into_iter().collect(),
            ..Script::default()
        };
        let mut st = TxStats::default();
        assert_eq!(q.flush(&mut s, &mut st), Flush::Blocked { data: true });
        assert_eq!(q.blocked(), Some(true));
        assert_eq!(flat(&s.sent), vec![0]);
        assert_eq!(q.len(), 9);
        // More datagrams arrive while blocked; they queue behind the rest.
        q.push(dg(10, 50, false, 9000));
        s.steps = [Step::Take(2), Step::Take(0), Step::WouldBlock]
            .into_iter()
            .collect();
        assert_eq!(q.flush(&mut s, &mut st), Flush::Blocked { data: false });
        assert_eq!(flat(&s.sent), vec![0, 1, 2]);
        assert_eq!(q.flush(&mut s, &mut st), Flush::Done);
        assert_eq!(q.blocked(), None);
        assert_eq!(flat(&s.sent), (0..11).collect::<Vec<_>>());
        assert_eq!(st.datagrams, 11);
        assert_eq!(st.errors, 0);
    }

    #[test]
    fn gso_refusal_falls_back_without_loss_or_duplicates() {
        let mut q = TxQueue::new(true);
        for i in 0..5 {
            q.push(dg(i, 1400, true, 9000));
        }
        let mut s = Script {
            steps: [Step::Fail(libc::EIO)].into_iter().collect(),
            ..Script::default()
        };
        let mut st = TxStats::default();
        assert_eq!(q.flush(&mut s, &mut st), Flush::Done);
        assert!(!q.gso());
        assert_eq!(flat(&s.sent), (0..5).collect::<Vec<_>>());
        assert!(s.sent.iter().all(|(_, ids)| ids.len() == 1));
        assert_eq!(st.errors, 0);
    }

    #[test]
    fn hard_error_drops_only_the_failed_message() {
        let mut q = TxQueue::new(false);
        for i in 0..4 {
            q.push(dg(i, 100, false, 9000));
        }
        let mut s = Script {
            steps: [Step::Take(1), Step::Fail(libc::ENETUNREACH)]
                .into_iter()
                .collect(),
            ..Script::default()
        };
        let mut st = TxStats::default();
        assert_eq!(q.flush(&mut s, &mut st), Flush::Done);
        assert_eq!(flat(&s.sent), vec![0, 2, 3]);
        assert_eq!(st.errors, 1);
        assert_eq!(st.datagrams, 3);
    }

    fn udp() -> std::net::UdpSocket {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    /// Receive until `want` datagrams arrived or a few seconds passed.
    fn receive(
        rx: &mut RxBatch,
        sock: &std::net::UdpSocket,
        want: usize,
        msgs: &mut usize,
    ) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < want && std::time::Instant::now() < until {
            match rx.recv(sock.as_raw_fd()) {
                Ok(n) => {
                    *msgs += n;
                    for i in 0..n {
                        assert!(!rx.truncated(i));
                        let (from, segs) = rx.datagrams(i);
                        assert!(from.is_some());
                        got.extend(segs.map(<[u8]>::to_vec));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                Err(e) => panic!("recvmmsg: {e}"),
            }
        }
        got
    }

    fn round_trip(gso: bool, gro: bool) {
        let (ctrl, data, recv) = (udp(), udp(), udp());
        if gro {
            assert!(enable_gro(recv.as_raw_fd()));
        }
        let port = recv.local_addr().unwrap().port();
        let mut sent = Vec::new();
        let mut q = TxQueue::new(gso);
        let mut sender = MmsgSender {
            ctrl: ctrl.as_raw_fd(),
            data: data.as_raw_fd(),
        };
        let mut st = TxStats::default();
        let mut rx = RxBatch::new();
        let mut got = Vec::new();
        let mut msgs = 0;
        // In chunks of 50 so the receiver's socket buffer never overflows.
        for i in 0..300u16 {
            // Runs of equal sizes with shorter ones and control datagrams in between.
            let len = match i % 50 {
                49 => 700,
                20 => 80,
                _ => 1400,
            };
            let d = dg(i, len, i % 50 != 20, port);
            sent.push(d.payload.clone());
            q.push(d);
            if i % 50 == 49 {
                while let Flush::Blocked { .. } = q.flush(&mut sender, &mut st) {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                got.extend(receive(&mut rx, &recv, sent.len() - got.len(), &mut msgs));
            }
        }
        assert_eq!(st.errors, 0);
        assert_eq!(st.datagrams, 300);
        // Two sockets: each class arrives in order; together, every datagram exactly once.
        let order = |v: &Vec<Vec<u8>>, ctl: bool| -> Vec<Vec<u8>> {
            v.iter()
                .filter(|p| (id(p) % 50 == 20) == ctl)
                .cloned()
                .collect()
        };
        assert_eq!(got.len(), sent.len());
        assert_eq!(order(&got, false), order(&sent, false));
        assert_eq!(order(&got, true), order(&sent, true));
        if gso {
            assert!(
                st.calls < 60,
                "{} sendmmsg calls for 300 datagrams",
                st.calls
            );
        }
        if gso && gro {
            // Loopback passes GSO messages up whole: GRO hands them over coalesced.
            assert!(msgs < 100, "{msgs} messages for 300 datagrams");
        } else {
            assert_eq!(msgs, 300);
        }
    }

    #[test]
    fn loopback_round_trip_with_gso_and_gro() {
        round_trip(true, true);
    }

    #[test]
    fn loopback_round_trip_with_gso_without_gro() {
        round_trip(true, false);
    }

    #[test]
    fn loopback_round_trip_plain() {
        round_trip(false, false);
    }

    /// Receive one datagram with its IP TOS byte (`IP_RECVTOS`).
    fn recv_with_tos(sock: &std::net::UdpSocket) -> Option<(usize, u8)> {
        let mut buf = [0u8; 2048];
        let mut cbuf = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: test-only recvmsg into local buffers that outlive the call.
        unsafe {
            let mut h: libc::msghdr = std::mem::zeroed();
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = std::mem::size_of_val(&cbuf) as _;
            let n = libc::recvmsg(sock.as_raw_fd(), &mut h, libc::MSG_DONTWAIT);
            if n < 0 {
                return None;
            }
            let mut c = libc::CMSG_FIRSTHDR(&h);
            while !c.is_null() {
                if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                    return Some((n as usize, *libc::CMSG_DATA(c)));
                }
                c = libc::CMSG_NXTHDR(&h, c);
            }
            Some((n as usize, 0))
        }
    }

    #[test]
    fn gso_segments_keep_the_sockets_dscp() {
        let (ctrl, data, recv) = (udp(), udp(), udp());
        let set =
            |s: &std::net::UdpSocket, tos: u32| socket2::SockRef::from(s).set_tos(tos).unwrap();
        set(&ctrl, 0xb8);
        set(&data, 0x20);
        socket2::SockRef::from(&recv).set_recv_tos(true).unwrap();
        let port = recv.local_addr().unwrap().port();
        let mut q = TxQueue::new(true);
        for i in 0..20u16 {
            q.push(dg(i, 1200, i != 10, port));
        }
        let mut sender = MmsgSender {
            ctrl: ctrl.as_raw_fd(),
            data: data.as_raw_fd(),
        };
        let mut st = TxStats::default();
        assert_eq!(q.flush(&mut sender, &mut st), Flush::Done);
        assert!(q.gso());
        assert!(st.calls <= 3, "{} calls", st.calls);
        let mut seen = Vec::new();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while seen.len() < 20 && std::time::Instant::now() < until {
            match recv_with_tos(&recv) {
                Some(x) => seen.push(x),
                None => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        assert_eq!(seen.len(), 20);
        assert!(seen.iter().all(|(n, _)| *n == 1200));
        let ef = seen.iter().filter(|(_, t)| *t == 0xb8).count();
        let cs1 = seen.iter().filter(|(_, t)| *t == 0x20).count();
        assert_eq!((ef, cs1), (1, 19));
    }

    #[test]
    fn segments_split_a_coalesced_message() {
        let data: Vec<u8> = (0..10u8).collect();
        let s = Segments {
            data: &data,
            size: 4,
            started: false,
        };
        let parts: Vec<&[u8]> = s.collect();
        assert_eq!(parts, vec![&data[0..4], &data[4..8], &data[8..10]]);
        let whole: Vec<&[u8]> = Segments {
            data: &data,
            size: 0,
            started: false,
        }
        .collect();
        assert_eq!(whole, vec![&data[..]]);
        let empty: Vec<&[u8]> = Segments {
            data: &[],
            size: 0,
            started: false,
        }
        .collect();
        let none: &[u8] = &[];
        assert_eq!(empty, vec![none]);
    }
}
