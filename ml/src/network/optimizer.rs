//! The update rules of a network's parameters from a batch's gradient: Adam (the default, as
//! scikit-learn's MLP) and SGD with momentum. L2 is added to the weights' gradient, not to the
//! biases'. A shard's round may correct its steps for drift ([`Optimizer::start_control`]).

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
    /// A shard's round with control variates (see [`Control`]).
    control: Option<Control>,
}

/// A shard's drift correction for one round (SCAFFOLD, Karimireddy et al. 2020): every step's
/// gradient plus `correction` (the coordinator's: all the shards' mean gradient of their last
/// rounds minus this shard's), so that a shard whose rows are unlike the others' (one class per
/// shard) steps along the whole table's gradient instead of away to its own optimum; and the
/// round's raw gradients summed, whose mean is this shard's next control.
struct Control {
    /// Empty: none yet (the first round), the steps go as they are.
    correction: Vec<f64>,
    sum: Vec<f64>,
    steps: u64,
}

impl Control {
    /// `g`, the gradient of parameter `i`, summed and corrected.
    fn corrected(&mut self, i: usize, g: f64) -> f64 {
        self.sum[i] += g;
        g + self.correction.get(i).copied().unwrap_or(0.0)
    }
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
            control: None,
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

    /// Corrects this round's steps by `correction` (empty: none yet, the first round), one
    /// value per parameter, and sums their raw gradients (see [`Control`]). False, and
    /// nothing changed, if `correction` has another length.
    pub fn start_control(&mut self, correction: Vec<f64>) -> Result<bool, NetworkError> {
        let n = self.first.len();
        if !correction.is_empty() && correction.len() != n {
            return Ok(false);
        }
        self.control = Some(Control {
            correction,
            sum: try_zeros(n)?,
            steps: 0,
        });
        Ok(true)
    }

    /// The mean raw gradient of this round's steps (this shard's control, for the
    /// coordinator), ending the round's correction; None without a control or a step.
    pub fn take_control(&mut self) -> Option<Vec<f64>> {
        let c = self.control.take().filter(|c| c.steps > 0)?;
        let n = c.steps as f64;
        Some(c.sum.into_iter().map(|s| s / n).collect())
    }

    /// One step: `params` moved along `gradient` (plus L2 on the parameters `is_weight` marks).
    pub fn step(&mut self, params: &mut [f64], gradient: &[f64], is_weight: &[bool]) {
        self.steps += 1;
        if let Some(c) = self.control.as_mut() {
            c.steps += 1;
        }
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
        if let Some(c) = self.control.as_mut() {
            c.steps += 1;
        }
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
        let mut control = self.control.as_mut();
        let mut raw = |i: usize, g: f64| match control.as_deref_mut() {
            Some(c) => c.corrected(i, g),
            None => g,
        };
        let parts = params[at.clone()]
            .iter_mut()
            .zip(at.clone().map(|i| raw(i, gradient[i])))
            .zip(&is_weight[at.clone()]);
        match self.kind {
            OptimizerKind::Adam => {
                let t = self.steps as f64;
                // The bias corrections folded into the step size, as scikit-learn does.
                let step = lr * (1.0 - BETA2.powf(t)).sqrt() / (1.0 - BETA1.powf(t));
                let moments = self.first[at.clone()]
                    .iter_mut()
                    .zip(self.second[at].iter_mut());
                for (((p, g), &weight), (m, v)) in parts.zip(moments) {
                    let g = if weight { g + l2 * *p } else { g };
                    *m = BETA1 * *m + (1.0 - BETA1) * g;
                    *v = BETA2 * *v + (1.0 - BETA2) * g * g;
                    *p -= step * *m / (v.sqrt() + EPSILON);
                }
            }
            OptimizerKind::Sgd { momentum } => {
                for (((p, g), &weight), v) in parts.zip(self.first[at].iter_mut()) {
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
        let control = self
            .control
            .as_ref()
            .map_or(0, |c| c.correction.len() + c.sum.len());
        ((self.first.len() + self.second.len() + control) * std::mem::size_of::<f64>()) as u64
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
