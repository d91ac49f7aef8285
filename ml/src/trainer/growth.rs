//! Growing the model: sparse rows with larger indices add features, new softmax class
//! indices add outputs. Every buffer that depends on the shape grows with the weights.

use super::{TrainError, Trainer};
use crate::limits::{try_filled, try_resize};

/// Copies a `rows × old_d` row-major matrix into `rows × new_d` (zero-padded).
fn widen(v: &mut Vec<f64>, rows: usize, old_d: usize, new_d: usize) -> Result<(), TrainError> {
    let oom = |_| TrainError::OutOfMemory {
        bytes: (rows * new_d * 8) as u64,
    };
    if rows <= 1 {
        return try_resize(v, rows * new_d, 0.0).map_err(oom);
    }
    let mut w = try_filled(rows * new_d, 0.0).map_err(oom)?;
    for r in 0..rows {
        w[r * new_d..r * new_d + old_d].copy_from_slice(&v[r * old_d..(r + 1) * old_d]);
    }
    *v = w;
    Ok(())
}

impl Trainer {
    /// Sparse data with larger indices than seen so far: new zero weights.
    pub(super) fn grow_features(&mut self, new_d: usize) -> Result<(), TrainError> {
        let old_d = self.model.n_features;
        let outputs = self.model.n_outputs;
        let oom = |_| TrainError::OutOfMemory {
            bytes: (new_d * 8) as u64,
        };
        // Every buffer first, so a failure leaves the model as it was.
        if self.config.batch_size > 1 {
            widen(&mut self.batch.grad_sum, outputs, old_d, new_d)?;
            try_resize(&mut self.batch.touched_mark, new_d, false).map_err(oom)?;
        }
        if self.lazy && !self.scaled_weights {
            // Zero weights have nothing pending.
            try_resize(&mut self.last, new_d, self.step).map_err(oom)?;
        }
        widen(&mut self.model.weights, outputs, old_d, new_d)?;
        self.model.n_features = new_d;
        Ok(())
    }

    /// Softmax saw class index `new_k - 1`: new zero rows (row-major, so appended).
    pub(crate) fn grow_classes(&mut self, new_k: usize) -> Result<(), TrainError> {
        let d = self.model.n_features;
        let oom = |_| TrainError::OutOfMemory {
            bytes: (new_k * d * 8) as u64,
        };
        if self.config.batch_size > 1 {
            try_resize(&mut self.batch.grad_sum, new_k * d, 0.0).map_err(oom)?;
        }
        try_resize(&mut self.model.weights, new_k * d, 0.0).map_err(oom)?;
        self.model.bias.resize(new_k, 0.0);
        self.batch.grad_bias_sum.resize(new_k, 0.0);
        self.model.n_outputs = new_k;
        Ok(())
    }
}
