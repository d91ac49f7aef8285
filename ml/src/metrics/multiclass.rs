//! Multiclass metrics: accuracy, per-class and macro-averaged precision, recall and F1, log
//! loss; [`MulticlassMetrics`] is also the part a shard sends.

use serde::{Deserialize, Serialize};

use super::{f1, ratio, EPS};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassReport {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub support: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MulticlassReport {
    pub accuracy: f64,
    /// By class index.
    pub per_class: Vec<ClassReport>,
    /// Unweighted means over the classes that were predicted or occur (as
    /// scikit-learn averages over the labels present in y_true ∪ y_pred).
    pub macro_precision: f64,
    pub macro_recall: f64,
    pub macro_f1: f64,
    /// None unless every pushed row had a probability.
    pub log_loss: Option<f64>,
    pub n: u64,
}

/// Multiclass metrics over class indices 0..K-1 (K grows if a larger index
/// is pushed). Serializes as the part a shard sends.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MulticlassMetrics {
    /// Per class: true positives, times predicted, times actual.
    tp: Vec<u64>,
    predicted: Vec<u64>,
    actual: Vec<u64>,
    n: u64,
    #[serde(with = "crate::nonfinite")]
    log_loss_sum: f64,
    all_have_prob: bool,
}

impl MulticlassMetrics {
    pub fn new(k: usize) -> Self {
        MulticlassMetrics {
            tp: vec![0; k],
            predicted: vec![0; k],
            actual: vec![0; k],
            n: 0,
            log_loss_sum: 0.0,
            all_have_prob: true,
        }
    }

    /// `prob_of_actual`: the model's probability of the actual class, if any.
    pub fn push(&mut self, predicted: usize, actual: usize, prob_of_actual: Option<f64>) {
        let need = predicted.max(actual) + 1;
        if need > self.tp.len() {
            self.tp.resize(need, 0);
            self.predicted.resize(need, 0);
            self.actual.resize(need, 0);
        }
        self.n += 1;
        self.predicted[predicted] += 1;
        self.actual[actual] += 1;
        if predicted == actual {
            self.tp[actual] += 1;
        }
        match prob_of_actual {
            Some(p) => self.log_loss_sum -= p.clamp(EPS, 1.0 - EPS).ln(),
            None => self.all_have_prob = false,
        }
    }

    /// Adds another part's rows.
    /// Classes counted.
    pub fn n_classes(&self) -> usize {
        self.tp.len()
    }

    /// Rows counted.
    pub fn rows(&self) -> u64 {
        self.n
    }

    /// Rows classified correctly.
    pub fn correct(&self) -> u64 {
        self.tp.iter().sum()
    }

    /// Why this part (from another server) cannot be merged into metrics of `k` classes.
    pub fn check(&self, k: usize) -> Result<(), String> {
        if self.tp.len() != k || self.predicted.len() != k || self.actual.len() != k {
            return Err(format!(
                "metrics of {}/{}/{} classes for a model of {k}",
                self.tp.len(),
                self.predicted.len(),
                self.actual.len()
            ));
        }
        Ok(())
    }

    pub fn merge(&mut self, other: &MulticlassMetrics) {
        let k = self.tp.len().max(other.tp.len());
        for v in [&mut self.tp, &mut self.predicted, &mut self.actual] {
            v.resize(k, 0);
        }
        for (c, ((tp, predicted), actual)) in other
            .tp
            .iter()
            .zip(&other.predicted)
            .zip(&other.actual)
            .enumerate()
        {
            self.tp[c] = self.tp[c].saturating_add(*tp);
            self.predicted[c] = self.predicted[c].saturating_add(*predicted);
            self.actual[c] = self.actual[c].saturating_add(*actual);
        }
        self.n = self.n.saturating_add(other.n);
        self.log_loss_sum += other.log_loss_sum;
        self.all_have_prob &= other.all_have_prob;
    }

    pub fn finish(self) -> MulticlassReport {
        let per_class: Vec<ClassReport> = (0..self.tp.len())
            .map(|c| {
                let precision = ratio(self.tp[c], self.predicted[c]);
                let recall = ratio(self.tp[c], self.actual[c]);
                ClassReport {
                    precision,
                    recall,
                    f1: f1(precision, recall),
                    support: self.actual[c],
                }
            })
            .collect();
        let present: Vec<&ClassReport> = per_class
            .iter()
            .enumerate()
            .filter(|(c, _)| self.actual[*c] > 0 || self.predicted[*c] > 0)
            .map(|(_, r)| r)
            .collect();
        let mean = |f: fn(&ClassReport) -> f64| {
            if present.is_empty() {
                0.0
            } else {
                present.iter().map(|r| f(r)).sum::<f64>() / present.len() as f64
            }
        };
        let correct: u64 = self.tp.iter().sum();
        MulticlassReport {
            accuracy: ratio(correct, self.n),
            macro_precision: mean(|r| r.precision),
            macro_recall: mean(|r| r.recall),
            macro_f1: mean(|r| r.f1),
            per_class,
            log_loss: (self.all_have_prob && self.n > 0).then(|| self.log_loss_sum / self.n as f64),
            n: self.n,
        }
    }
}
