//! Helpers shared by the integration tests of the ML core.

use corgipile_ml::arena::TupleArena;
use corgipile_ml::trainer::{EpochStats, TrainConfig, Trainer};

/// Trains `epochs` epochs over `buffers` (each trained in storage order).
pub fn run(
    config: TrainConfig,
    d: usize,
    buffers: &[TupleArena],
    epochs: u32,
) -> (Trainer, Vec<EpochStats>) {
    let mut t = Trainer::new(config, d);
    let mut stats = Vec::new();
    for e in 1..=epochs {
        t.start_epoch(e);
        for b in buffers {
            t.train_buffer(b, None).unwrap();
        }
        stats.push(t.finish_epoch().unwrap());
    }
    (t, stats)
}
