//! Flow sets: flows drawn at random (endpoints, sizes, start times) from the scenario's seed,
//! expanded into ordinary flows before the run, so that a result has the same shape whether
//! its flows were listed or drawn.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::Simulation;
use crate::error::ScenarioError;
use crate::scenario::{Endpoint, FlowSetSpec, FlowSpec, Size};

/// Mixed into the run's seed (with the set's index) for a flow set's draws, so that each set
/// draws from a stream of its own: adding a set moves neither the others nor the medium.
const FLOW_SET_SEED_MIX: u64 = 0x666c_6f77_7365_7473;

impl Simulation {
    /// Append the flows of every `[[flow_sets]]` to the scenario's flows, in set order.
    pub(super) fn expand_flow_sets(&mut self) -> Result<(), ScenarioError> {
        let sets = self.sc.flow_sets.clone();
        for (i, set) in sets.iter().enumerate() {
            let flows = self.draw_flow_set(i, set)?;
            self.sc.flows.extend(flows);
        }
        Ok(())
    }

    fn draw_flow_set(&self, i: usize, set: &FlowSetSpec) -> Result<Vec<FlowSpec>, ScenarioError> {
        let w = format!("flow_sets[{i}]");
        let n = self.nodes_len() as u32;
        let fits = |e: Endpoint, x: u32| matches!(e, Endpoint::Random) || e == Endpoint::Node(x);
        // Every (src, dst) the set allows whose route has at least min_hops hops; drawn
        // uniformly, with replacement.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for s in (0..n).filter(|&s| fits(set.src, s)) {
            for d in (0..n).filter(|&d| d != s && fits(set.dst, d)) {
                if self.route_hops(s, d).is_some_and(|h| h >= set.min_hops) {
                    pairs.push((s, d));
                }
            }
        }
        if pairs.is_empty() {
            return Err(ScenarioError::Invalid(format!(
                "{w}: no src/dst pair has a route of at least {} hop(s)",
                set.min_hops
            )));
        }
        let (lo, hi) = set
            .size
            .bounds()
            .map_err(|e| ScenarioError::Invalid(format!("{w}: {e}")))?;
        let mix = FLOW_SET_SEED_MIX ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = SmallRng::seed_from_u64(self.seed ^ mix);
        let mut t = set.start;
        // With `each_source`: `count` flows per source, each to one of that source's pairs
        // (the pairs are in source order).
        let draws: Vec<std::ops::Range<usize>> = if set.each_source {
            let mut ranges = Vec::new();
            let mut at = 0;
            while at < pairs.len() {
                let end = at + pairs[at..].partition_point(|p| p.0 == pairs[at].0);
                ranges.extend(std::iter::repeat_n(at..end, set.count as usize));
                at = end;
            }
            ranges
        } else {
            vec![0..pairs.len(); set.count as usize]
        };
        let mut out = Vec::with_capacity(draws.len());
        for range in draws {
            let (src, dst) = pairs[rng.gen_range(range)];
            let size = rng.gen_range(lo..=hi);
            let start = match (set.rate_per_s, set.start_window) {
                (Some(rate), _) => {
                    // Exponential gap: -ln(1 - U) / rate, U uniform in [0, 1).
                    t += -(1.0 - rng.gen::<f64>()).ln() / rate;
                    t
                }
                (None, Some([from, to])) if to > from => rng.gen_range(from..to),
                (None, Some([from, _])) => from,
                (None, None) => set.start,
            };
            out.push(FlowSpec {
                src,
                dst,
                size: Size::Bytes(size),
                start,
                transport: set.transport.clone(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use crate::{Registry, Scenario, Simulation};

    fn flows(text: &str) -> Vec<(u32, u32, u64, f64)> {
        let sc = Scenario::from_toml(text).unwrap();
        let sim = Simulation::new(sc, Registry::builtin()).unwrap();
        sim.sc
            .flows
            .iter()
            .map(|f| (f.src, f.dst, f.size.bytes().unwrap(), f.start))
            .collect()
    }

    const CHAIN: &str = "[topology]\nnodes = 6\ngenerator = \"chain\"\n";

    #[test]
    fn random_pairs_respect_min_hops_fixed_ends_and_sizes() {
        let text = format!(
            "{CHAIN}[[flows]]\nsrc = 0\ndst = 1\nsize = 10\n\
             [[flow_sets]]\ncount = 200\nmin_hops = 3\nsize = [\"1KB\", \"2KB\"]\n\
             [[flow_sets]]\ncount = 20\nsrc = 5\nsize = 7\nstart = 2.5\n"
        );
        let f = flows(&text);
        assert_eq!(f.len(), 221);
        assert_eq!(f[0], (0, 1, 10, 0.0), "listed flows come first");
        for &(s, d, size, start) in &f[1..201] {
            assert!(s.abs_diff(d) >= 3, "{s}->{d} is fewer than 3 hops");
            assert!((1000..=2000).contains(&size));
            assert_eq!(start, 0.0);
        }
        // Both directions and more than a couple of sizes are drawn.
        assert!(f[1..201].iter().any(|x| x.0 < x.1) && f[1..201].iter().any(|x| x.0 > x.1));
        assert!(
            f[1..201]
                .iter()
                .map(|x| x.2)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 50
        );
        for &(s, d, size, start) in &f[201..] {
            assert_eq!((s, size, start), (5, 7, 2.5));
            assert_ne!(d, 5);
        }
        assert_eq!(f, flows(&text), "seeded");
        assert_ne!(f, flows(&format!("seed = 2\n{text}")));
    }

    #[test]
    fn each_source_opens_count_flows_to_its_own_destinations() {
        let text = format!(
            "{CHAIN}[[flow_sets]]\ncount = 10\neach_source = true\nmin_hops = 4\nsize = 1\n"
        );
        let f = flows(&text);
        // Sources with a destination 4+ hops away on the chain 0-5: 0, 1, 4, 5.
        assert_eq!(f.len(), 40);
        for s in [0, 1, 4, 5] {
            let mine: Vec<_> = f.iter().filter(|x| x.0 == s).collect();
            assert_eq!(mine.len(), 10, "source {s}");
            assert!(mine.iter().all(|x| x.1.abs_diff(s) >= 4));
        }
    }

    #[test]
    fn poisson_arrivals_have_the_given_rate_and_windows_stay_inside() {
        let text = format!(
            "{CHAIN}[[flow_sets]]\ncount = 2000\nsize = 1\nstart = 10.0\nrate_per_s = 4.0\n\
             [[flow_sets]]\ncount = 500\nsize = 1\nstart_window = [3.0, 5.0]\n"
        );
        let f = flows(&text);
        let poisson: Vec<f64> = f[..2000].iter().map(|x| x.3).collect();
        assert!(poisson.windows(2).all(|w| w[0] <= w[1]) && poisson[0] > 10.0);
        // 2000 arrivals at 4/s take about 500 s (the sum's standard deviation is ~11 s).
        let span = poisson[1999] - 10.0;
        assert!((450.0..550.0).contains(&span), "{span}");
        let window: Vec<f64> = f[2000..].iter().map(|x| x.3).collect();
        assert!(window.iter().all(|&t| (3.0..5.0).contains(&t)));
        let mean = window.iter().sum::<f64>() / window.len() as f64;
        assert!((mean - 4.0).abs() < 0.1, "{mean}");
    }

    #[test]
    fn impossible_sets_are_errors() {
        for (set, want) in [
            ("count = 1\nmin_hops = 6\nsize = 1", "no src/dst pair"),
            (
                "count = 1\nsrc = 2\ndst = 2\nsize = 1",
                "src and dst are both 2",
            ),
            (
                "count = 1\nsize = 1\nrate_per_s = 1.0\nstart_window = [0.0, 1.0]",
                "not both",
            ),
            ("count = 1\nsize = [\"2KB\", \"1KB\"]", "min above max"),
            ("count = 0\nsize = 1", "count"),
            ("count = 1\nsrc = \"any\"\nsize = 1", "random"),
        ] {
            let text = format!("{CHAIN}[[flow_sets]]\n{set}\n");
            let e = Scenario::from_toml(&text)
                .and_then(|sc| Simulation::new(sc, Registry::builtin()).map(|_| ()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{set}: {e}");
        }
    }
}
