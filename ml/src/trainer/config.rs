//! What the trainer is given and what it reports as errors: [`TrainConfig`], the
//! learning-rate schedule, [`TrainError`] and the interrupt check.

use crate::model::ModelKind;
use crate::params::{ScheduleKind, TrainParams};
use crate::stats::Standardizer;

/// Largest number of softmax classes (class indices 0..MAX_CLASSES-1).
pub const MAX_CLASSES: usize = 1 << 16;

/// Learning rate of each epoch from the base rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LrSchedule {
    /// `learning_rate` every epoch.
    Constant,
    /// `learning_rate · decay^(epoch-1)`.
    Exponential { decay: f64 },
    /// `learning_rate / sqrt(epoch)`.
    InverseSqrt,
}

impl LrSchedule {
    pub const NAMES: [&'static str; 3] = ["constant", "exponential", "inverse_sqrt"];

    pub fn learning_rate(self, base: f64, epoch: u32) -> f64 {
        match self {
            LrSchedule::Constant => base,
            LrSchedule::Exponential { decay } => base * decay.powf(f64::from(epoch - 1)),
            LrSchedule::InverseSqrt => base / f64::from(epoch).sqrt(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            LrSchedule::Constant => "constant",
            LrSchedule::Exponential { .. } => "exponential",
            LrSchedule::InverseSqrt => "inverse_sqrt",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    pub kind: ModelKind,
    pub learning_rate: f64,
    pub schedule: LrSchedule,
    /// L2 strength (weights only, not the bias): decay `1 - lr·l2` per step.
    pub l2: f64,
    /// L1 strength (weights only): clip toward zero by `lr·l1` per step
    /// (truncated gradient), which yields exact zeros.
    pub l1: f64,
    /// Gradients of `batch_size` tuples are averaged into one step.
    pub batch_size: usize,
    /// false: the bias stays 0.
    pub fit_intercept: bool,
    /// Per class weight on each tuple's loss and gradient: binary
    /// `[negative, positive]`, softmax by class index (missing → 1). Ignored
    /// by linear. Binary kinds then need `label_values`.
    pub class_weights: Option<Vec<f64>>,
    /// Binary kinds: the raw (negative, positive) label values, if known up
    /// front. Required with `class_weights` (the provisional mapping could
    /// not fix a class weight applied to the wrong class).
    pub label_values: Option<(f64, f64)>,
    /// Train on standardized rows (dense: centered or not; sparse: never
    /// centered). The model is then in standardized units: see
    /// [`LinearModel::fold_standardizer`](crate::model::LinearModel::fold_standardizer).
    pub standardizer: Option<Standardizer>,
    /// Return the average of the iterates from this epoch on (see `average`); None = the
    /// last iterate.
    pub average_from_epoch: Option<u32>,
}

impl TrainConfig {
    /// The defaults of [`crate::TrainParams`] for `kind`.
    pub fn new(kind: ModelKind) -> Self {
        TrainConfig {
            kind,
            learning_rate: 0.01,
            schedule: LrSchedule::Exponential { decay: 0.95 },
            l2: 0.0,
            l1: 0.0,
            batch_size: 1,
            fit_intercept: true,
            class_weights: None,
            label_values: None,
            standardizer: None,
            average_from_epoch: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TrainError {
    /// A third distinct raw label value was seen: the two known ones, then the
    /// new one. A NaN label is reported this way too (with NaN as the new value).
    #[error("{}", too_many_labels(values))]
    TooManyLabels { values: [f64; 3] },
    /// Softmax: a label that is not a class index in 0..MAX_CLASSES;
    /// linear: a label that is not finite.
    #[error("{}", invalid_label(*value, *kind))]
    InvalidLabel { value: f64, kind: ModelKind },
    /// Loss or weights became NaN or infinite, or a regression's loss grew beyond
    /// [`crate::divergence::DIVERGED_FACTOR`] times a zero model's (see [`crate::divergence`]).
    #[error("training diverged in epoch {epoch}: loss or weights became NaN or infinite, or the loss more than 1000 times a zero model's")]
    Diverged { epoch: u32 },
    /// Growing the model needed `bytes` more than the process could allocate.
    #[error("out of memory growing the model by {bytes} bytes")]
    OutOfMemory { bytes: u64 },
    /// The interrupt check (see [`Trainer::set_interrupt`](super::Trainer::set_interrupt)) asked to stop.
    #[error("training interrupted")]
    Interrupted,
    /// A network: a row of a class beyond the output layer's `classes` (those the statistics
    /// pass counted; a sharded training reads the table anew every round).
    #[error("label class {class} is not one of the network's {classes} classes")]
    UnknownClass { class: f64, classes: usize },
}

impl TrainError {
    /// A suggestion for the user, suitable for an error HINT.
    pub fn hint(&self) -> &'static str {
        match self {
            TrainError::TooManyLabels { .. } => {
                "svm and logistic are binary classifiers: the label column must hold exactly two distinct values (use softmax for more classes)"
            }
            TrainError::InvalidLabel { kind, .. } if !kind.is_classifier() => {
                "remove rows whose label is NaN or infinite"
            }
            TrainError::InvalidLabel { .. } => "softmax supports at most 65536 classes",
            TrainError::Diverged { .. } => {
                "lower learning_rate, raise l2, or set normalize to true to scale the features"
            }
            TrainError::OutOfMemory { .. } => {
                "the server could not allocate the model: train a smaller one (fewer features or classes)"
            }
            TrainError::Interrupted => "the training was stopped",
            TrainError::UnknownClass { .. } => {
                "the label column gained a class after the statistics pass: train again"
            }
        }
    }
}

/// TooManyLabels's text: a NaN label is reported as a third value.
fn too_many_labels([a, b, c]: &[f64; 3]) -> String {
    if c.is_nan() {
        "label value NaN is not a valid class label".to_string()
    } else {
        format!("label column has more than two distinct values (found {a}, {b} and {c})")
    }
}

/// InvalidLabel's text: regression needs a finite number, classes a class index.
fn invalid_label(value: f64, kind: ModelKind) -> String {
    if kind.is_classifier() {
        format!(
            "label value {value} is not a class index from 0 to {}",
            MAX_CLASSES - 1
        )
    } else {
        format!("label value {value} is not a finite number")
    }
}

/// See [`Trainer::set_interrupt`](super::Trainer::set_interrupt).
pub type InterruptCheck = Box<dyn FnMut() -> bool + Send>;

impl ScheduleKind {
    /// The schedule a `learning_rate_schedule` param names, with its `decay`.
    pub fn schedule(self, decay: f64) -> LrSchedule {
        match self {
            ScheduleKind::Constant => LrSchedule::Constant,
            ScheduleKind::Exponential => LrSchedule::Exponential { decay },
            ScheduleKind::InverseSqrt => LrSchedule::InverseSqrt,
        }
    }
}

impl TrainParams {
    /// The trainer configuration these parameters describe. Data-dependent
    /// parts are left for the caller: `class_weights` (see
    /// [`ClassWeight::resolve`](crate::params::ClassWeight::resolve)), `label_values` and `standardizer` (see
    /// [`crate::FeatureStats`]) are None.
    pub fn train_config(&self, kind: ModelKind) -> TrainConfig {
        TrainConfig {
            kind,
            learning_rate: self.learning_rate,
            schedule: self.learning_rate_schedule.schedule(self.decay),
            l2: self.l2,
            l1: self.l1,
            batch_size: self.batch_size as usize,
            fit_intercept: self.fit_intercept,
            class_weights: None,
            label_values: None,
            standardizer: None,
            average_from_epoch: self.average.then_some(if self.epochs >= 2 { 2 } else { 1 }),
        }
    }
}
