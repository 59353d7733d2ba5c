//! The radio model on the medium: carrier sense beyond decode range, checked with the
//! test-only probe transport (tests/common).

mod common;

use common::run;

/// Senders 0 and 2 on either side of receiver 1, 90 m from it and 180 m from each other;
/// decode range 100 m, carrier sense range `cs`.
fn line(cs: f64) -> String {
    format!(
        r#"
seed = 11
duration = 5.0
run_to_end = true
[topology]
range_m = 100.0
carrier_sense_range_m = {cs}
[[topology.nodes]]
id = 0
x = 0.0
y = 0.0
[[topology.nodes]]
id = 1
x = 90.0
y = 0.0
[[topology.nodes]]
id = 2
x = 180.0
y = 0.0
[[flows]]
src = 0
dst = 1
size = "300KB"
transport = "probe"
[[flows]]
src = 2
dst = 1
size = "300KB"
transport = "probe"
"#
    )
}

#[test]
fn carrier_sense_beyond_decode_range_stops_hidden_senders_colliding() {
    let hidden = run(&line(100.0));
    let sensing = run(&line(200.0));
    assert!(hidden.medium.collisions > 50, "hidden: {:?}", hidden.medium);
    assert!(
        sensing.medium.collisions * 10 < hidden.medium.collisions,
        "sensing {} vs hidden {}",
        sensing.medium.collisions,
        hidden.medium.collisions
    );
    // Sensed frames are never decoded: 0 and 2 hear nothing from each other.
    for r in [&hidden, &sensing] {
        for n in [0, 2] {
            assert_eq!(r.nodes[n].datagrams_overheard, 0, "{:?}", r.nodes[n]);
        }
    }
}

#[test]
fn a_sensed_transmission_spoils_a_reception_it_overlaps() {
    // 0 sends to 1 (90 m west of it), 3 sends to 2 (85 m west of 3). Node 2 is 130 m from 0:
    // beyond decode range, within either carrier sense range below, so 0's frames spoil
    // what 2 receives unless 3 defers to 0 while 0 is on the air.
    let text = r#"
seed = 5
duration = 5.0
run_to_end = true
[topology]
range_m = 100.0
carrier_sense_range_m = CS
[[topology.nodes]]
id = 0
x = 0.0
y = 0.0
[[topology.nodes]]
id = 1
x = -90.0
y = 0.0
[[topology.nodes]]
id = 2
x = 130.0
y = 0.0
[[topology.nodes]]
id = 3
x = 215.0
y = 0.0
[[flows]]
src = 0
dst = 1
size = "300KB"
transport = "probe"
[[flows]]
src = 3
dst = 2
size = "300KB"
transport = "probe"
"#;
    // 0 and 3 are 215 m apart: with CS = 150 m, 2 senses 0 but 3 does not, so 0's frames
    // collide with 3's at 2. With CS = 220 m, 3 senses 0 and defers.
    let exposed = run(&text.replace("CS", "150.0"));
    let deferring = run(&text.replace("CS", "220.0"));
    let at2 = |r: &hop_sim::SimResult| r.nodes[2].mac.rx_collisions;
    assert!(at2(&exposed) > 50, "{:?}", exposed.nodes[2].mac);
    assert!(
        at2(&deferring) * 10 < at2(&exposed),
        "deferring {} vs not {}",
        at2(&deferring),
        at2(&exposed)
    );
}
