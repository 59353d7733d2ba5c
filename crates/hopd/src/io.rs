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
                // An int in glibc, an unsigned int in musl (the static builds).
                libc::MSG_DONTWAIT as _,
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
            // An int in glibc, an unsigned int in musl (the static builds).
            libc::MSG_DONTWAIT as _,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests;
