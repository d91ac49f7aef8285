//! The update rules of a network's parameters from a batch's gradient: Adam (the default, as
//! scikit-learn's MLP) and SGD with momentum. L2 is added to the weights' gradient, not to the
//! biases'.

use super::{try_zeros, NetworkError};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// Kingma & Ba, with scikit-learn's defaults (β₁ 0.9, β₂ 0.999, ε 1e-8).
    Adam,
    /// Heavy-ball momentum: `v = μ·v - lr·g; p += v`.
    Sgd { momentum: f64 },
}

pub struct Optimizer {
    kind: OptimizerKind,
    learning_rate: f64,
    l2: f64,
    /// Adam's first and second moments, or the momentum's velocity (first only).
    first: Vec<f64>,
    second: Vec<f64>,
    steps: u64,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPSILON: f64 = 1e-8;

impl Optimizer {
    /// State for `n_params` parameters, allocated fallibly.
    pub fn new(
        kind: OptimizerKind,
        learning_rate: f64,
        l2: f64,
        n_params: usize,
    ) -> Result<Optimizer, NetworkError> {
        let second = match kind {
            OptimizerKind::Adam => try_zeros(n_params)?,
            OptimizerKind::Sgd { .. } => Vec::new(),
        };
        Ok(Optimizer {
            kind,
            learning_rate,
            l2,
            first: try_zeros(n_params)?,
            second,
            steps: 0,
        })
    }

    /// The step size from the next step on (the epoch's, by the learning-rate schedule).
    pub fn set_learning_rate(&mut self, learning_rate: f64) {
        self.learning_rate = learning_rate;
    }

    /// Bytes of state per parameter (for the memory check).
    pub fn bytes_per_param(kind: OptimizerKind) -> u64 {
        match kind {
            OptimizerKind::Adam => 16,
            OptimizerKind::Sgd { .. } => 8,
        }
    }

    /// One step: `params` moved along `gradient` (plus L2 on the parameters `is_weight` marks).
    pub fn step(&mut self, params: &mut [f64], gradient: &[f64], is_weight: &[bool]) {
        self.steps += 1;
        self.update(params, gradient, is_weight, 0..params.len());
    }

    /// One step on the parameters in `ranges` only (the rest had no gradient: a lazy step, as
    /// TensorFlow's LazyAdam; with every parameter in `ranges`, the same as [`step`]).
    ///
    /// [`step`]: Self::step
    pub fn step_ranges(
        &mut self,
        params: &mut [f64],
        gradient: &[f64],
        is_weight: &[bool],
        ranges: &[std::ops::Range<usize>],
    ) {
        self.steps += 1;
        for r in ranges {
            self.update(params, gradient, is_weight, r.clone());
        }
    }

    /// The update of the parameters in `at` (the step counted by the caller).
    fn update(
        &mut self,
        params: &mut [f64],
        gradient: &[f64],
        is_weight: &[bool],
        at: std::ops::Range<usize>,
    ) {
        let (lr, l2) = (self.learning_rate, self.l2);
        let parts = params[at.clone()]
            .iter_mut()
            .zip(&gradient[at.clone()])
            .zip(&is_weight[at.clone()]);
        match self.kind {
            OptimizerKind::Adam => {
                let t = self.steps as f64;
                // The bias corrections folded into the step size, as scikit-learn does.
                let step = lr * (1.0 - BETA2.powf(t)).sqrt() / (1.0 - BETA1.powf(t));
                let moments = self.first[at.clone()]
                    .iter_mut()
                    .zip(self.second[at].iter_mut());
                for (((p, &g), &weight), (m, v)) in parts.zip(moments) {
                    let g = if weight { g + l2 * *p } else { g };
                    *m = BETA1 * *m + (1.0 - BETA1) * g;
                    *v = BETA2 * *v + (1.0 - BETA2) * g * g;
                    *p -= step * *m / (v.sqrt() + EPSILON);
                }
            }
            OptimizerKind::Sgd { momentum } => {
                for (((p, &g), &weight), v) in parts.zip(self.first[at].iter_mut()) {
                    let g = if weight { g + l2 * *p } else { g };
                    *v = momentum * *v - lr * g;
                    *p += *v;
                }
            }
        }
    }
}

impl Optimizer {
    pub fn kind(&self) -> OptimizerKind {
        self.kind
    }

    /// Bytes of state this optimizer holds.
    pub fn bytes(&self) -> u64 {
        ((self.first.len() + self.second.len()) * std::mem::size_of::<f64>()) as u64
    }

    /// Whether this state fits `n_params` parameters trained by `kind` (a state kept from an
    /// earlier round of the same training).
    pub fn fits(&self, kind: OptimizerKind, n_params: usize) -> bool {
        self.kind == kind
            && self.first.len() == n_params
            && self.second.len()
                == if kind == OptimizerKind::Adam {
                    n_params
                } else {
                    0
                }
    }
}
