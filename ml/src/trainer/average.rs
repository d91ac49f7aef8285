//! Iterate averaging (Polyak–Ruppert, as scikit-learn's `SGDClassifier(average=True)`): the
//! model returned is the mean of the iterates from the averaging epoch on, sampled every
//! `every` steps and at the end of every epoch. The last iterate of SGD moves with the last
//! tuples it saw (on a table clustered by label, with the class mix of the last buffers); the
//! average does not, so the result depends far less on the seed.
//!
//! A sample costs O(d·K); `every` >= d·K keeps that at most one weight operation per step.

use super::{TrainError, Trainer};
use crate::limits::{try_filled, try_resize};
use crate::model::LinearModel;

pub(super) struct Average {
    /// Sums of the sampled weights (row-major, as the model's) and biases.
    pub(super) weights: Vec<f64>,
    pub(super) bias: Vec<f64>,
    pub(super) samples: u64,
    /// Steps between samples, and steps left to the next one.
    every: u64,
    until_next: u64,
    /// Averaging starts with this epoch.
    pub(super) from_epoch: u32,
}

/// Fewest steps between two samples.
const MIN_EVERY: u64 = 64;

impl Average {
    pub(super) fn new(from_epoch: u32) -> Average {
        Average {
            weights: Vec::new(),
            bias: Vec::new(),
            samples: 0,
            every: MIN_EVERY,
            until_next: MIN_EVERY,
            from_epoch,
        }
    }
}

impl Trainer {
    /// Counts a step; samples the iterate when due.
    #[inline]
    pub(super) fn average_step(&mut self) -> Result<(), TrainError> {
        match &mut self.average {
            Some(a) if self.epoch >= a.from_epoch => {
                a.until_next -= 1;
                if a.until_next == 0 {
                    self.sample_average()?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Adds the current iterate (brought up to date) to the sums.
    pub(super) fn sample_average(&mut self) -> Result<(), TrainError> {
        if self
            .average
            .as_ref()
            .is_none_or(|a| self.epoch < a.from_epoch)
        {
            return Ok(());
        }
        self.sync();
        let (d, k) = (self.model.n_features, self.model.n_outputs);
        let a = self.average.as_mut().expect("checked above");
        if a.weights.len() != self.model.weights.len() {
            // The model grew (sparse features, softmax classes): new coordinates were 0 in
            // every earlier sample. Re-laid out row by row, as the model's rows widened.
            let old_d = if a.bias.is_empty() {
                d
            } else {
                a.weights.len() / a.bias.len()
            };
            let mut grown = try_filled(d * k, 0.0).map_err(|_| TrainError::OutOfMemory {
                bytes: (d * k * 8) as u64,
            })?;
            for (r, row) in a.weights.chunks(old_d.max(1)).enumerate() {
                grown[r * d..r * d + row.len()].copy_from_slice(row);
            }
            a.weights = grown;
            try_resize(&mut a.bias, k, 0.0).map_err(|_| TrainError::OutOfMemory {
                bytes: (k * 8) as u64,
            })?;
        }
        for (s, w) in a.weights.iter_mut().zip(&self.model.weights) {
            *s += w;
        }
        for (s, b) in a.bias.iter_mut().zip(&self.model.bias) {
            *s += b;
        }
        a.samples += 1;
        a.every = (self.model.weights.len() as u64).max(MIN_EVERY);
        a.until_next = a.every;
        self.work += self.model.weights.len() as u64;
        Ok(())
    }

    /// The model training would return now: the average of the sampled iterates if there
    /// are any, else the current iterate. None if memory for the copy is short.
    pub fn result_model(&mut self) -> Option<LinearModel> {
        self.sync();
        match &self.average {
            Some(a) if a.samples > 0 => {
                let mut m = LinearModel {
                    kind: self.model.kind,
                    n_features: self.model.n_features,
                    n_outputs: self.model.n_outputs,
                    weights: try_filled(self.model.weights.len(), 0.0).ok()?,
                    bias: self.model.bias.clone(),
                };
                let n = a.samples as f64;
                let d = self.model.n_features;
                let old_d = a.weights.len() / a.bias.len().max(1);
                // Coordinates added after the last sample averaged 0.
                for (r, row) in a.weights.chunks(old_d.max(1)).enumerate() {
                    for (j, s) in row.iter().enumerate() {
                        m.weights[r * d + j] = s / n;
                    }
                }
                for (k, b) in m.bias.iter_mut().enumerate() {
                    *b = a.bias.get(k).map_or(0.0, |s| s / n);
                }
                Some(m)
            }
            _ => self.model.try_clone(),
        }
    }
}

impl Trainer {
    /// The final model: the average (computed in the sums' own memory) or the last iterate.
    pub(super) fn take_result(&mut self) -> LinearModel {
        self.sync();
        let kind = self.model.kind;
        let model = std::mem::replace(
            &mut self.model,
            LinearModel {
                kind,
                n_features: 0,
                n_outputs: 0,
                weights: Vec::new(),
                bias: Vec::new(),
            },
        );
        match self.average.take() {
            Some(a) if a.samples > 0 && a.weights.len() == model.weights.len() => {
                let n = a.samples as f64;
                let mut weights = a.weights;
                weights.iter_mut().for_each(|w| *w /= n);
                LinearModel {
                    weights,
                    bias: a.bias.iter().map(|b| b / n).collect(),
                    ..model
                }
            }
            Some(a) if a.samples > 0 => {
                // Grew after the last sample: the copying path.
                self.model = model;
                self.average = Some(a);
                let m = self.result_model().unwrap_or_else(|| self.model.clone());
                self.average = None;
                m
            }
            _ => model,
        }
    }
}
