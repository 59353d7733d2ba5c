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
    fn send_batch(&mut self, data: bool, items: &[Datagram], spans: &[Span]) -> io::Result<usize> {
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
    let set = |s: &std::net::UdpSocket, tos: u32| socket2::SockRef::from(s).set_tos(tos).unwrap();
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
