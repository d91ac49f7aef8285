//! Binary kinds: mapping raw label values to ±1 as they arrive. The first value gets a
//! provisional mapping (≤ 0 → -1, else +1); when the second value shows the guess was
//! wrong, the whole training state is negated (`flip`), which is exact.

use super::{TrainError, Trainer};
use crate::scoring::BinaryLabels;

/// What is known about the raw label values (binary kinds).
#[derive(Clone, Copy, Debug)]
pub(super) enum LabelsSeen {
    None,
    /// One value seen, mapped provisionally to `y` (≤ 0 → -1, else +1).
    One {
        value: f64,
        y: f64,
    },
    /// Final mapping: `neg` → -1, `pos` → +1.
    Two {
        neg: f64,
        pos: f64,
    },
}

/// The final mapping `neg` → -1, `pos` → +1: the same rule validation and evaluation use.
#[inline(always)]
fn final_mapping(neg: f64, pos: f64) -> BinaryLabels {
    BinaryLabels::Values {
        negative: neg,
        positive: pos,
    }
}

impl Trainer {
    /// Binary kinds: `(negative, positive)`, the raw label values mapped to -1
    /// and +1. None unless two distinct values have been seen (or given).
    pub fn label_map(&self) -> Option<(f64, f64)> {
        match self.labels {
            LabelsSeen::Two { neg, pos } => Some((neg, pos)),
            _ => None,
        }
    }

    /// Binary kinds: distinct raw label values seen so far, ascending (0, 1 or
    /// 2 of them; given `label_values` count as seen). Empty for other kinds.
    pub fn labels_seen(&self) -> Vec<f64> {
        match self.labels {
            LabelsSeen::None => Vec::new(),
            LabelsSeen::One { value, .. } => vec![value],
            LabelsSeen::Two { neg, pos } if neg < pos => vec![neg, pos],
            LabelsSeen::Two { neg, pos } => vec![pos, neg],
        }
    }

    /// Maps a raw label to ±1, learning the mapping as values arrive.
    #[inline]
    pub(super) fn map_label(&mut self, raw: f64) -> Result<f64, TrainError> {
        match self.labels {
            LabelsSeen::Two { neg, pos } => match final_mapping(neg, pos).sign(raw) {
                Some(y) => Ok(y),
                None => {
                    let (a, b) = if neg < pos { (neg, pos) } else { (pos, neg) };
                    Err(TrainError::TooManyLabels {
                        values: [a, b, raw],
                    })
                }
            },
            LabelsSeen::One { value, y } => {
                if raw == value {
                    return Ok(y);
                }
                if raw.is_nan() {
                    return Err(TrainError::TooManyLabels {
                        values: [value, f64::NAN, f64::NAN],
                    });
                }
                let (neg, pos) = if value < raw {
                    (value, raw)
                } else {
                    (raw, value)
                };
                let y_value = if value == neg { -1.0 } else { 1.0 };
                if y_value != y {
                    self.flip(y);
                }
                self.labels = LabelsSeen::Two { neg, pos };
                // `raw` is one of the two values, so the mapping knows it.
                Ok(final_mapping(neg, pos).sign(raw).unwrap_or(1.0))
            }
            LabelsSeen::None => {
                if raw.is_nan() {
                    return Err(TrainError::TooManyLabels {
                        values: [f64::NAN; 3],
                    });
                }
                // Guess: labels like -1/0/false are usually the negative class.
                let y = if raw <= 0.0 { -1.0 } else { 1.0 };
                self.labels = LabelsSeen::One { value: raw, y };
                Ok(y)
            }
        }
    }

    /// The provisional label (`wrong_y`) of every tuple seen so far was the
    /// negation of the true one. Both losses satisfy loss(z,y) = loss(-z,-y) and
    /// dloss(-z,-y) = -dloss(z,y), and IEEE arithmetic commutes with negation, so
    /// training with all labels negated produces exactly the negated model (and
    /// negated gradient sums). Negating them therefore yields bit-for-bit the
    /// state of a run that knew the mapping from the start (up to the sign of
    /// weights that are exactly zero). Pending lazy decay/clipping is odd in w
    /// too, so it may stay pending. (Never reached with class weights: those
    /// require `label_values`.)
    pub(super) fn flip(&mut self, wrong_y: f64) {
        for w in &mut self.model.weights {
            *w = -*w;
        }
        for b in &mut self.model.bias {
            *b = -*b;
        }
        for s in &mut self.batch.grad_sum {
            *s = -*s;
        }
        for s in &mut self.batch.grad_bias_sum {
            *s = -*s;
        }
        // z == 0 predicts +1 in both runs, so ties are the one place where
        // "correct" is not symmetric: they were right iff the provisional y was +1.
        let sums = &mut self.sums;
        if wrong_y > 0.0 {
            sums.correct -= sums.provisional_ties;
        } else {
            sums.correct += sums.provisional_ties;
        }
        sums.provisional_ties = 0;
    }
}
