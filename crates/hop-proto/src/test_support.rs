//! Helpers shared by the transports' unit tests.

use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::{Ctx, Instant, NodeId, StaticRoutes};

/// A node's surroundings for driving one transport directly: routes and seeded randomness.
pub(crate) struct Env {
    routes: StaticRoutes,
    rng: SmallRng,
}

impl Env {
    pub(crate) fn new(routes: &[(NodeId, NodeId)], seed: u64) -> Self {
        Env {
            routes: routes.iter().copied().collect(),
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    pub(crate) fn ctx(&mut self, now: Instant, local: NodeId) -> Ctx<'_> {
        Ctx {
            now,
            local,
            routing: &self.routes,
            rng: &mut self.rng,
        }
    }
}
