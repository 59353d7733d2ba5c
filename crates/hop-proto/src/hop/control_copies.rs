//! Control copies (not in the paper): BSYNs and BACKs numbered per neighbour, the loss of
//! each neighbour's numbered datagrams measured and reported back, a BSYN or BACK sent twice
//! where they are lost toward its addressee, and a BACK that names the BSYNs it follows.
//!
//! A block moves in BSYN/BACK rounds (§3.1): the sender sends nothing of the block between a
//! round's BSYN and its BACK, so a lost BSYN or BACK costs a timer's wait. The paper's MAC
//! retries control frames (§4.1); over a link without retries a share p of each is lost and
//! about 2p of the rounds wait (at 30 % loss, half of them). Two copies back to back make
//! that about 2p². A BACK copy must not be taken for the answer to the sender's next round,
//! so a BACK carries the latest number it heard from its addressee (`echo`): a BACK that
//! heard nothing of the round's BSYNs is news, not the round's answer.

use super::*;

/// A neighbour's reported loss (in 1/255) from which this node sends its control datagrams
/// to it twice: 5 %. Below it a copy costs more air than the rounds it saves (each lost round
/// waits at least two timer ticks, a copy one control frame per round).
pub(super) const COPY_LOSS: u8 = 13;

/// A neighbour's reported loss from which each control datagram goes three times: 17 %, where
/// two copies would both be lost 3 % of the time.
pub(super) const THREE_COPY_LOSS: u8 = 44;

/// Weight of one datagram in the smoothed loss: about the last 32 numbered datagrams.
const LOSS_GAIN: f64 = 1.0 / 32.0;

/// Numbered datagrams heard each way before a neighbour's loss counts as known: until then
/// its BSYNs and BACKs go at least twice where copies are on.
const KNOWN_AFTER: u32 = 8;

/// A gap in a neighbour's numbers longer than this is a restart or a long silence, not loss.
const MAX_GAP: u16 = 1024;

/// What this node knows of the control datagrams it exchanges with each neighbour.
#[derive(Debug, Default)]
pub(super) struct ControlLink {
    peers: BTreeMap<NodeId, Peer>,
}

#[derive(Debug, Default)]
struct Peer {
    /// The number of this node's latest control datagram to the neighbour (0: none yet).
    sent: u16,
    /// The neighbour's latest report of this node's datagrams lost, in 1/255.
    reported_loss: u8,
    /// The number of the neighbour's latest datagram received (0: none).
    heard: u16,
    /// Smoothed share of the neighbour's numbered datagrams not received.
    loss: f64,
    /// The neighbour's numbered datagrams counted into `loss` so far (received and lost),
    /// up to the smoothing's memory.
    counted: u32,
    /// The highest of this node's numbers the neighbour has echoed (numbers start at 1): about
    /// how many of ours its reports rest on.
    echoed: u32,
}

impl Peer {
    /// Count one of the neighbour's numbered datagrams, received or lost: a moving average
    /// over about the last 32, and the plain average of those counted until there are 32,
    /// so that the first rounds over a lossy link already know its loss (from 0 with the
    /// smoothing's gain alone, 30 % loss took about 20 datagrams to reach the two-copy
    /// threshold, and the rounds in between lost their BSYN or BACK about half the time).
    fn count(&mut self, lost: bool) {
        self.counted = self.counted.saturating_add(1);
        let gain = LOSS_GAIN.max(1.0 / f64::from(self.counted));
        let target = if lost { 1.0 } else { 0.0 };
        self.loss += (target - self.loss) * gain;
    }
}

/// The number after `s`, skipping 0 (which means "none").
fn after(s: u16) -> u16 {
    match s.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

/// Datagrams from `from` (exclusive) up to `to` (inclusive), numbers skipping 0.
fn distance(from: u16, to: u16) -> u16 {
    let d = to.wrapping_sub(from);
    if to < from {
        d.saturating_sub(1)
    } else {
        d
    }
}

/// Whether number `a` is `b` or later (within half the number space).
pub(super) fn seq_at_or_after(a: u16, b: u16) -> bool {
    a.wrapping_sub(b) < 0x8000
}

impl ControlLink {
    /// Number the next control datagram to `to` and fill its control fields.
    pub(super) fn stamp(&mut self, to: NodeId) -> ControlSeq {
        let p = self.peers.entry(to).or_default();
        p.sent = after(p.sent);
        ControlSeq {
            seq: p.sent,
            echo: p.heard,
            loss: (p.loss * 255.0).round().clamp(0.0, 255.0) as u8,
        }
    }

    /// How many times control datagrams to `to` go: once, twice where 5 % or more of ours are
    /// lost toward it, three times where a pair would still be lost 3 % of the time (p ≥ 17
    /// %). The loss taken is the larger of its report and this node's own measure of the
    /// neighbour's datagrams: a report sent before the neighbour heard many of ours says
    /// little, and a link that loses one way mostly loses both ways. Twice to a neighbour
    /// not yet heard: a first BSYN and its BACK lost over a lossy link cost the first block a
    /// timer's wait each (50 ms before any round trip was measured), and a copy costs a
    /// loss-free link one small datagram.
    pub(super) fn copies(&self, cfg: &HopConfig, to: NodeId) -> usize {
        if !cfg.control_copies.on() {
            return 1;
        }
        let Some(p) = self.peers.get(&to) else {
            return 2;
        };
        let own = (p.loss * 255.0).round().clamp(0.0, 255.0) as u8;
        let by_loss = match p.reported_loss.max(own) {
            l if l >= THREE_COPY_LOSS => 3,
            l if l >= COPY_LOSS => 2,
            _ => 1,
        };
        // Until a few datagrams have crossed each way, neither measure says much.
        let known = p.counted >= KNOWN_AFTER && p.echoed >= KNOWN_AFTER;
        if known {
            by_loss
        } else {
            by_loss.max(2)
        }
    }

    /// Take the control fields of a BSYN or BACK from `from`. False if it is a copy whose
    /// original arrived (to be dropped: the original was handled).
    pub(super) fn on_received(&mut self, from: NodeId, ctl: ControlSeq, copy: bool) -> bool {
        if ctl.seq == 0 {
            return true;
        }
        let p = self.peers.entry(from).or_default();
        p.reported_loss = ctl.loss;
        p.echoed = p.echoed.max(u32::from(ctl.echo));
        if p.heard == 0 {
            p.heard = ctl.seq;
            p.count(false);
            return true;
        }
        let gap = distance(p.heard, ctl.seq);
        if gap == 0 || !seq_at_or_after(ctl.seq, p.heard) {
            // A duplicate or a datagram overtaken by a later one: no news of loss.
            return !(copy && gap == 0);
        }
        let original_heard = copy && gap == 1;
        if gap <= MAX_GAP {
            for _ in 1..gap {
                p.count(true);
            }
            p.count(false);
        }
        p.heard = ctl.seq;
        !original_heard
    }

    /// The share of `from`'s numbered datagrams this node has not received (smoothed).
    #[cfg(test)]
    pub(super) fn loss_of(&self, from: NodeId) -> f64 {
        self.peers.get(&from).map_or(0.0, |p| p.loss)
    }

    /// Each neighbour this node has exchanged numbered datagrams with, and the loss each
    /// way (for operators: `hop status`, metrics).
    pub(super) fn reports(
        &self,
    ) -> impl Iterator<Item = (NodeId, crate::transport::ControlLoss)> + '_ {
        self.peers.iter().map(|(id, p)| {
            (
                *id,
                crate::transport::ControlLoss {
                    from: p.loss,
                    to: f64::from(p.reported_loss) / 255.0,
                },
            )
        })
    }
}

impl HopTransport {
    /// Queue a control datagram to `next_hop`: a BSYN or BACK is numbered, and sent twice
    /// where `next_hop` reports our control datagrams lost (a micro-block's BSYNs once: they
    /// carry its packets, and the next hop answers the last of a round). Returns the number
    /// of the datagram's (first) copy, 0 for other messages.
    pub(super) fn queue_control(&mut self, next_hop: NodeId, mut body: Vec<u8>) -> u16 {
        let numbered = matches!(
            body.first().map(|t| MsgType::from_u8(*t)),
            Some(Ok(MsgType::Bsyn | MsgType::Back))
        );
        if !numbered {
            // The end-to-end BACK that finishes a flow goes as often as a BSYN would, and at
            // least twice where copies are on: no later one covers its loss (fin_probe.rs),
            // and a short flow may end before its next hop's loss report has grown to 5 %
            // (one lost datagram raises it by 3 %); its end then waited the source's 60 s
            // timer (docs/notebook/2026-12-03-first-block-on-a-lossy-link.md). A second copy
            // costs one small datagram per flow and hop. Each relay passes it on once; a copy
            // that is passed on is not copied again.
            let flags = body.get(1).copied().unwrap_or(0);
            let copies = match body.first().map(|t| MsgType::from_u8(*t)) {
                Some(Ok(MsgType::E2eBack)) if flags & (FLAG_FIN | FLAG_COPY) == FLAG_FIN => {
                    let by_loss = self.control_link.copies(&self.cfg, next_hop);
                    if self.cfg.control_copies.on() {
                        by_loss.max(2)
                    } else {
                        by_loss
                    }
                }
                _ => 1,
            };
            for i in 0..copies {
                let mut b = body.clone();
                if i > 0 {
                    b[1] |= FLAG_COPY;
                    bump(&mut self.stats.extra, "control_copies_sent");
                }
                self.control.push_back(Outgoing {
                    next_hop,
                    class: Class::Control,
                    body: b,
                    head: 0,
                });
            }
            return 0;
        }
        let ctl = self.control_link.stamp(next_hop);
        hop_wire::hop::set_control_seq(&mut body, ctl);
        let micro = body.get(1).is_some_and(|f| f & FLAG_MICRO != 0);
        let copies = if micro {
            1
        } else {
            self.control_link.copies(&self.cfg, next_hop)
        };
        let mut extra = Vec::new();
        for _ in 1..copies {
            let mut c = body.clone();
            c[1] |= FLAG_COPY;
            hop_wire::hop::set_control_seq(&mut c, self.control_link.stamp(next_hop));
            extra.push(c);
        }
        self.control.push_back(Outgoing {
            next_hop,
            class: Class::Control,
            body,
            head: 0,
        });
        for body in extra {
            bump(&mut self.stats.extra, "control_copies_sent");
            self.control.push_back(Outgoing {
                next_hop,
                class: Class::Control,
                body,
                head: 0,
            });
        }
        ctl.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl(seq: u16) -> ControlSeq {
        ControlSeq {
            seq,
            echo: 0,
            loss: 0,
        }
    }

    #[test]
    fn numbers_skip_zero_and_wrap() {
        let mut c = ControlLink::default();
        assert_eq!(c.stamp(7).seq, 1);
        c.peers.get_mut(&7).unwrap().sent = u16::MAX;
        assert_eq!(c.stamp(7).seq, 1);
        assert_eq!(distance(u16::MAX, 1), 1);
        assert!(seq_at_or_after(1, u16::MAX));
        assert!(!seq_at_or_after(u16::MAX, 1));
    }

    #[test]
    fn gaps_in_a_neighbours_numbers_are_its_loss() {
        let mut c = ControlLink::default();
        // Every third datagram lost, over many: the smoothed loss settles near a third.
        let mut s = 0u16;
        for i in 0..3000u32 {
            s = after(s);
            if i % 3 != 2 {
                assert!(c.on_received(9, ctl(s), false));
            }
        }
        let l = c.loss_of(9);
        assert!((0.25..0.42).contains(&l), "{l}");
        // None lost for a while: it decays to about nothing.
        for _ in 0..300 {
            s = after(s);
            c.on_received(9, ctl(s), false);
        }
        assert!(c.loss_of(9) < 0.01);
        // A restart (numbers from 1 again) is not counted as loss.
        c.on_received(9, ctl(1), false);
        c.on_received(9, ctl(2), false);
        assert!(c.loss_of(9) < 0.01);
    }

    #[test]
    fn a_copy_whose_original_arrived_is_dropped_and_one_that_replaces_it_is_taken() {
        let mut c = ControlLink::default();
        assert!(c.on_received(3, ctl(10), false));
        assert!(
            !c.on_received(3, ctl(11), true),
            "the original (10) was heard"
        );
        assert!(
            c.on_received(3, ctl(13), true),
            "the original (12) was lost"
        );
        assert!(!c.on_received(3, ctl(13), true), "the same datagram twice");
    }

    /// A neighbour both of whose measures rest on enough datagrams: `KNOWN_AFTER` of its
    /// heard here, none lost, and a report that echoes that many of ours.
    fn known(c: &mut ControlLink, to: NodeId) {
        for s in 1..=KNOWN_AFTER as u16 {
            c.on_received(
                to,
                ControlSeq {
                    seq: s,
                    echo: s,
                    loss: 0,
                },
                false,
            );
        }
    }

    #[test]
    fn copies_follow_the_neighbours_report_and_the_switch() {
        let mut c = ControlLink::default();
        let cfg = HopConfig {
            control_copies: ControlCopies::On,
            ..HopConfig::default()
        };
        assert_eq!(c.copies(&cfg, 4), 2, "a neighbour not heard yet");
        known(&mut c, 4);
        assert_eq!(c.copies(&cfg, 4), 1);
        let report = |seq, loss| ControlSeq {
            seq,
            echo: 100,
            loss,
        };
        for (i, (loss, copies)) in [
            (COPY_LOSS - 1, 1),
            (COPY_LOSS, 2),
            (THREE_COPY_LOSS - 1, 2),
            (THREE_COPY_LOSS, 3),
        ]
        .into_iter()
        .enumerate()
        {
            c.on_received(4, report(KNOWN_AFTER as u16 + 1 + i as u16, loss), false);
            assert_eq!(c.copies(&cfg, 4), copies, "reported loss {loss}");
        }
        assert_eq!(c.copies(&HopConfig::paper(), 4), 1);
        assert_eq!(
            c.copies(&HopConfig::default(), 4),
            1,
            "`auto` sends none until the runtime names its link"
        );
        assert_eq!(c.copies(&HopConfig::default().for_link(true), 4), 1);
        assert_eq!(c.copies(&HopConfig::default().for_link(false), 4), 3);
        assert_eq!(c.copies(&HopConfig::paper().for_link(false), 4), 1);
        assert_eq!(c.copies(&cfg.clone().for_link(true), 4), 3, "`true` stays");
        assert_eq!(
            c.copies(&HopConfig::default(), 5),
            1,
            "not even to a neighbour not heard yet where copies are off"
        );
    }

    #[test]
    fn until_a_few_datagrams_crossed_each_way_control_goes_at_least_twice() {
        let cfg = HopConfig::default().for_link(false);
        let mut c = ControlLink::default();
        // Heard from, with a report of none of ours lost that rests on one of ours.
        c.on_received(
            6,
            ControlSeq {
                seq: 1,
                echo: 1,
                loss: 0,
            },
            false,
        );
        assert_eq!(c.copies(&cfg, 6), 2);
        // Many of its heard here, but its report still rests on few of ours.
        for s in 2..=20 {
            c.on_received(
                6,
                ControlSeq {
                    seq: s,
                    echo: 2,
                    loss: 0,
                },
                false,
            );
        }
        assert_eq!(c.copies(&cfg, 6), 2);
        c.on_received(
            6,
            ControlSeq {
                seq: 21,
                echo: KNOWN_AFTER as u16,
                loss: 0,
            },
            false,
        );
        assert_eq!(c.copies(&cfg, 6), 1, "both measures rest on enough now");
    }

    #[test]
    fn the_first_datagrams_set_the_loss_as_their_plain_share() {
        // Three of the first ten numbers lost: the measure says 30 % at once, where the
        // smoothing alone (gain 1/32 from 0) would still say under 9 %.
        let mut c = ControlLink::default();
        for s in [1u16, 2, 4, 5, 7, 8, 10] {
            c.on_received(9, ctl(s), false);
        }
        let l = c.loss_of(9);
        assert!((0.25..=0.35).contains(&l), "{l}");
    }

    #[test]
    fn copies_follow_this_nodes_own_measure_where_the_report_is_lower() {
        // A link that loses a neighbour's datagrams mostly loses ours too: with every other
        // of its numbers missing here, our BACKs go three times though its report (sent
        // before it heard many of ours) says none of ours were lost.
        let cfg = HopConfig::default().for_link(false);
        let mut c = ControlLink::default();
        for k in 0..40u16 {
            c.on_received(
                2,
                ControlSeq {
                    seq: 1 + 2 * k,
                    echo: 50,
                    loss: 0,
                },
                false,
            );
        }
        assert_eq!(c.copies(&cfg, 2), 3);
    }
}
