//! Rows the unit tests train on (test builds only).

use crate::arena::TupleArena;
use crate::trainer::EpochStats;

/// `n` rows of 3 features in [-10, 10) from a fixed stream, labelled 1 above the hyperplane
/// x0 - 2 x1 + 0.5 = 0 and 0 below it.
pub(crate) fn hyperplane_rows(n: usize) -> TupleArena {
    let mut arena = TupleArena::new(3, n);
    let mut s = 7u64;
    for _ in 0..n {
        let mut x = [0.0; 3];
        for v in &mut x {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *v = (s >> 33) as f64 / 2f64.powi(31) * 20.0 - 10.0;
        }
        let y = if x[0] - 2.0 * x[1] + 0.5 > 0.0 {
            1.0
        } else {
            0.0
        };
        arena.push(y, &x);
    }
    arena
}

/// A classifier's epoch of 1,000 tuples at accuracy 0.75 with this loss.
pub(crate) fn epoch_stats(epoch: u32, loss: f64) -> EpochStats {
    EpochStats {
        epoch,
        loss,
        accuracy: Some(0.75),
        r2: None,
        tuples: 1000,
        learning_rate: 0.01,
    }
}
