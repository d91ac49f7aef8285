//! SGD trainer for linear models (svm, logistic, linear, softmax) on dense or
//! sparse rows.
//!
//! The caller drives epochs: `start_epoch`, any number of `train_buffer` calls
//! (one per filled CorgiPile buffer), then `finish_epoch`. Mini-batches may span
//! buffers. Binary label values are mapped to ±1 on the fly (see
//! [`Trainer::label_map`]); softmax labels are class indices 0..K-1 and K
//! grows as new indices appear; linear labels are used as they are.
//!
//! Sparse rows only touch their non-zero coordinates: L2 decay and L1 clipping
//! of the other coordinates are applied lazily (see [`Trainer::catch_up`]), or,
//! without L1 (one output, batch_size 1), L2 decay is a global scale of the
//! weights (see `scaled_weights`), so a step costs O(nnz·K) whatever the
//! dimension. Dense rows are updated eagerly with the same formulas.

use crate::arena::{prefetch_l2, TupleArena};
use crate::limits::{try_filled, try_resize};
use crate::model::{argmax, sign, softmax_loss, sparse_axpy, sparse_dot, LinearModel, ModelKind, Row};
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
    /// [`LinearModel::fold_standardizer`].
    pub standardizer: Option<Standardizer>,
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
        }
    }
}

/// Statistics of one epoch, measured on each tuple with the model from before
/// that tuple's update (progressive validation).
#[derive(Clone, Debug, PartialEq)]
pub struct EpochStats {
    pub epoch: u32,
    /// Mean per-tuple loss (class-weighted) + 0.5·l2·‖W‖² + l1·‖W‖₁.
    /// Linear: the loss is 0.5·(z - y)², so the mean is half the MSE.
    pub loss: f64,
    /// Classifiers: fraction classified correctly (0 for an empty epoch).
    /// None for linear.
    pub accuracy: Option<f64>,
    /// Linear: 1 - SSE/SST over the epoch's tuples (SST == 0: 1 if SSE == 0
    /// else 0, like scikit-learn). None for classifiers and empty epochs.
    pub r2: Option<f64>,
    pub tuples: u64,
    pub learning_rate: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TrainError {
    /// A third distinct raw label value was seen: the two known ones, then the
    /// new one. A NaN label is reported this way too (with NaN as the new value).
    TooManyLabels { values: [f64; 3] },
    /// Softmax: a label that is not a class index in 0..MAX_CLASSES;
    /// linear: a label that is not finite.
    InvalidLabel { value: f64, kind: ModelKind },
    /// Loss or weights became NaN or infinite.
    Diverged { epoch: u32 },
    /// Growing the model needed `bytes` more than the process could allocate.
    OutOfMemory { bytes: u64 },
    /// The interrupt check (see [`Trainer::set_interrupt`]) asked to stop.
    Interrupted,
}

impl TrainError {
    /// A suggestion for the user, suitable for an error HINT.
    pub fn hint(&self) -> &'static str {
        match self {
            TrainError::TooManyLabels { .. } => {
                "svm and logistic are binary classifiers: the label column must hold exactly two distinct values (use softmax for more classes)"
            }
            TrainError::InvalidLabel {
                kind: ModelKind::Linear,
                ..
            } => "remove rows whose label is NaN or infinite",
            TrainError::InvalidLabel { .. } => "softmax supports at most 65536 classes",
            TrainError::Diverged { .. } => {
                "lower learning_rate, raise l2, or set normalize to true to scale the features"
            }
            TrainError::OutOfMemory { .. } => {
                "the server could not allocate the model: train a smaller one (fewer features or classes)"
            }
            TrainError::Interrupted => "the training was stopped",
        }
    }
}

impl std::fmt::Display for TrainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TrainError::TooManyLabels { values: [a, b, c] } => {
                if c.is_nan() {
                    write!(f, "label value NaN is not a valid class label")
                } else {
                    write!(
                        f,
                        "label column has more than two distinct values (found {a}, {b} and {c})"
                    )
                }
            }
            TrainError::InvalidLabel {
                value,
                kind: ModelKind::Linear,
            } => write!(f, "label value {value} is not a finite number"),
            TrainError::InvalidLabel { value, .. } => write!(
                f,
                "label value {value} is not a class index from 0 to {}",
                MAX_CLASSES - 1
            ),
            TrainError::Diverged { epoch } => {
                write!(
                    f,
                    "training diverged in epoch {epoch}: loss or weights became NaN or infinite"
                )
            }
            TrainError::OutOfMemory { bytes } => {
                write!(f, "out of memory growing the model by {bytes} bytes")
            }
            TrainError::Interrupted => write!(f, "training interrupted"),
        }
    }
}

impl std::error::Error for TrainError {}

/// What is known about the raw label values (binary kinds).
#[derive(Clone, Copy, Debug)]
enum Labels {
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

pub struct Trainer {
    config: TrainConfig,
    model: LinearModel,
    labels: Labels,

    epoch: u32,
    lr: f64,
    loss_sum: f64,
    correct: u64,
    tuples: u64,
    /// Tuples with z == 0 this epoch while the label mapping was provisional;
    /// needed to fix `correct` if the mapping flips (see `flip`).
    provisional_ties: u64,
    /// Linear: Σ(z - y)² and Welford mean / M2 of y, for R².
    sse: f64,
    y_mean: f64,
    y_m2: f64,

    /// Scores, then gradients d loss / d output, of the current tuple.
    gz: Vec<f64>,
    /// Standardized values of the current tuple.
    scaled: Vec<f64>,

    /// Partial mini-batch: Σ g·x (K × d), Σ g per output, tuple count, and
    /// whether any g != 0.
    grad_sum: Vec<f64>,
    grad_bias_sum: Vec<f64>,
    batch_count: usize,
    batch_has_grad: bool,
    /// Whether the batch holds a dense row (then the flush updates every
    /// coordinate, else only `touched`).
    batch_dense: bool,
    /// Sparse mini-batch: features with a gradient in the batch, and a mark per
    /// feature so each is listed once.
    touched: Vec<u32>,
    touched_mark: Vec<bool>,

    /// Lazy regularization (only when l2 or l1 != 0): `step` counts the sparse
    /// steps taken; coordinate j has had all steps before `last[j]` applied.
    lazy: bool,
    step: u64,
    last: Vec<u64>,
    /// Some coordinate may be behind `step` (or `scale` is not 1).
    pending: bool,
    /// Sparse rows without L1, one output, batch_size 1: the weights are stored as `v` with
    /// w = scale·v, so the per-step L2 decay of every coordinate is one multiply of `scale`
    /// (O(1)) and a step touches only the row's coordinates — no per-coordinate catch-up, no
    /// `last`. Folded back into the weights by `sync`. Without L2, scale stays 1.
    scaled_weights: bool,
    scale: f64,

    /// Weight-coordinate updates done (a cost measure, see `coordinate_updates`).
    work: u64,

    /// Called every few hundred thousand multiply-adds inside a buffer; `true` stops the
    /// buffer with [`TrainError::Interrupted`] (cancel must not wait for a whole buffer).
    interrupt: Option<InterruptCheck>,
}

/// See [`Trainer::set_interrupt`].
pub type InterruptCheck = Box<dyn FnMut() -> bool + Send>;

/// Multiply-adds between two interrupt checks: well under a millisecond of work.
const WORK_BETWEEN_CHECKS: usize = 1 << 18;

/// `scale` below this is folded into the weights (keeps v = w/scale far from overflow).
const MIN_SCALE: f64 = 1e-100;

/// How many tuples ahead of SGD a shuffled buffer is prefetched: enough to cover a memory
/// access (~100 ns) with a few steps of tens of ns each.
const PREFETCH_AHEAD: usize = 8;

/// How many tuples ahead the weights of a sparse row are prefetched: its indices, prefetched
/// `PREFETCH_AHEAD` tuples ahead, have arrived by then.
const WEIGHTS_AHEAD: usize = 4;

/// Sparse models with at least this many weights (256 KiB) get them prefetched; smaller ones
/// stay in cache, where the prefetches cost more than they save (measured: ~10% of a step
/// over 40 features).
const PREFETCH_WEIGHTS_MIN: usize = 1 << 15;

/// Moves w toward 0 by `c`, stopping at 0.
#[inline]
fn clip(w: f64, c: f64) -> f64 {
    if w > c {
        w - c
    } else if w < -c {
        w + c
    } else {
        0.0
    }
}

/// `k` regularization-only steps `w ← clip(w·s, c)`. Few steps are applied one
/// by one (bit-identical to the eager dense update); many in closed form:
/// |w| decreases monotonically, so after k steps it is
/// `s^k|w| - c(1 - s^k)/(1 - s)` (`|w| - ck` if s = 1), floored at 0.
#[inline]
fn pending_reg(w: f64, k: u64, s: f64, c: f64) -> f64 {
    if k <= 16 || s <= 0.0 {
        let mut w = w;
        for _ in 0..k {
            w *= s;
            if c != 0.0 {
                w = clip(w, c);
            }
            if w == 0.0 {
                break;
            }
        }
        return w;
    }
    let sk = if k <= i32::MAX as u64 {
        s.powi(k as i32)
    } else {
        s.powf(k as f64)
    };
    if c == 0.0 {
        return w * sk;
    }
    let drop = if s == 1.0 {
        c * k as f64
    } else {
        c * (1.0 - sk) / (1.0 - s)
    };
    let a = (w.abs() * sk - drop).max(0.0);
    if w < 0.0 {
        -a
    } else {
        a
    }
}

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
    /// A zero model, ready for epoch 1 (calling `start_epoch(1)` is still
    /// expected). `n_features` may be 0 for sparse data: the model grows to
    /// the largest index seen. A softmax model starts with 0 classes.
    pub fn new(config: TrainConfig, n_features: usize) -> Self {
        Self::try_new(config, n_features).expect("memory for the model")
    }

    /// [`Trainer::new`], failing with [`TrainError::OutOfMemory`] instead of aborting when
    /// the model cannot be allocated.
    pub fn try_new(config: TrainConfig, n_features: usize) -> Result<Self, TrainError> {
        assert!(config.batch_size >= 1, "batch_size must be >= 1");
        if config.class_weights.is_some() && config.kind.is_binary() {
            assert!(
                config.label_values.is_some(),
                "binary class_weights need label_values"
            );
        }
        let kind = config.kind;
        let outputs = usize::from(kind != ModelKind::Softmax);
        let mini = config.batch_size > 1;
        let lazy = config.l2 != 0.0 || config.l1 != 0.0;
        // lr·l2 < 1 keeps every per-step factor positive (the schedules never raise lr).
        let scaled_weights = config.l1 == 0.0
            && config.learning_rate * config.l2 < 1.0
            && config.batch_size == 1
            && kind != ModelKind::Softmax;
        let labels = match config.label_values {
            Some((neg, pos)) => {
                assert!(
                    neg != pos && !neg.is_nan() && !pos.is_nan(),
                    "bad label_values"
                );
                Labels::Two { neg, pos }
            }
            None => Labels::None,
        };
        let oom = |_| TrainError::OutOfMemory {
            bytes: (n_features as u64).saturating_mul(8 * outputs as u64),
        };
        let zeros = |n: usize, wanted: bool| if wanted { try_filled(n, 0.0) } else { Ok(Vec::new()) };
        let mut t = Trainer {
            model: LinearModel {
                kind,
                n_features,
                n_outputs: outputs,
                weights: try_filled(n_features * outputs, 0.0).map_err(oom)?,
                bias: vec![0.0; outputs],
            },
            // Only mini-batches need the accumulators.
            grad_sum: zeros(n_features * outputs, mini).map_err(oom)?,
            grad_bias_sum: vec![0.0; outputs],
            touched_mark: if mini {
                try_filled(n_features, false).map_err(oom)?
            } else {
                Vec::new()
            },
            last: if lazy && !scaled_weights {
                try_filled(n_features, 0).map_err(oom)?
            } else {
                Vec::new()
            },
            lazy,
            scaled_weights,
            scale: 1.0,
            config,
            labels,
            epoch: 1,
            lr: 0.0,
            loss_sum: 0.0,
            correct: 0,
            tuples: 0,
            provisional_ties: 0,
            sse: 0.0,
            y_mean: 0.0,
            y_m2: 0.0,
            gz: Vec::new(),
            scaled: Vec::new(),
            batch_count: 0,
            batch_has_grad: false,
            batch_dense: false,
            touched: Vec::new(),
            step: 0,
            pending: false,
            work: 0,
            interrupt: None,
        };
        t.start_epoch(1);
        Ok(t)
    }

    /// Installs (or removes) the check `train_buffer` calls between rows, often enough that
    /// a stop request is seen within a millisecond or so of work whatever one row costs.
    pub fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        self.interrupt = check;
    }

    /// Begins `epoch` (>= 1): sets its learning rate from the schedule and
    /// resets the epoch's sums. A partial mini-batch left over without
    /// `finish_epoch` is discarded.
    pub fn start_epoch(&mut self, epoch: u32) {
        assert!(epoch >= 1, "epochs start at 1");
        // Pending regularization belongs to the old learning rate.
        self.sync();
        self.epoch = epoch;
        self.lr = self
            .config
            .schedule
            .learning_rate(self.config.learning_rate, epoch);
        self.loss_sum = 0.0;
        self.correct = 0;
        self.tuples = 0;
        self.provisional_ties = 0;
        self.sse = 0.0;
        self.y_mean = 0.0;
        self.y_m2 = 0.0;
        self.reset_batch();
    }

    /// Trains on the arena's tuples in `order` (a permutation of `0..len`) or in
    /// storage order. Stops at the first error.
    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        if arena.is_sparse() {
            if arena.n_features() > self.model.n_features {
                self.grow_features(arena.n_features())?;
            }
        } else {
            assert_eq!(
                arena.n_features(),
                self.model.n_features,
                "dense arena width must match the model"
            );
            // Dense steps are eager: settle what sparse steps left pending.
            self.sync();
        }
        if let Some(order) = order {
            assert_eq!(
                order.len(),
                arena.len(),
                "order must be a permutation of the arena"
            );
        }
        // Taken out so rows may borrow them while `step` borrows self.
        let standardizer = self.config.standardizer.take();
        let mut scaled = std::mem::take(&mut self.scaled);
        // Separate loops, so dense rows and small models pay nothing for the weight prefetch.
        let result = if arena.is_sparse() && self.model.weights.len() >= PREFETCH_WEIGHTS_MIN {
            self.train_rows::<true>(arena, order, standardizer.as_ref(), &mut scaled)
        } else {
            self.train_rows::<false>(arena, order, standardizer.as_ref(), &mut scaled)
        };
        self.scaled = scaled;
        self.config.standardizer = standardizer;
        result
    }

    fn train_rows<const PREFETCH_WEIGHTS: bool>(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
        standardizer: Option<&Standardizer>,
        scaled: &mut Vec<f64>,
    ) -> Result<(), TrainError> {
        let n = arena.len();
        // An interrupt check every WORK_BETWEEN_CHECKS multiply-adds (softmax grows its
        // outputs as classes appear, so the cost of a row is read per row).
        let row_cost = 1 + if arena.is_sparse() {
            arena.nnz() / n.max(1)
        } else {
            arena.n_features()
        };
        let mut work_since_check = 0usize;
        for pos in 0..n {
            work_since_check += row_cost * self.model.n_outputs.max(1);
            if work_since_check >= WORK_BETWEEN_CHECKS {
                work_since_check = 0;
                if let Some(check) = self.interrupt.as_mut() {
                    if check() {
                        return Err(TrainError::Interrupted);
                    }
                }
            }
            if PREFETCH_WEIGHTS && pos + WEIGHTS_AHEAD < n {
                let ahead = order.map_or(pos + WEIGHTS_AHEAD, |o| o[pos + WEIGHTS_AHEAD] as usize);
                if let Row::Sparse { indices, .. } = arena.row(ahead) {
                    self.prefetch_weights(indices);
                }
            }
            let i = match order {
                Some(o) => {
                    // Shuffled order: start loading a tuple a few steps ahead (see prefetch).
                    if let Some(&ahead) = o.get(pos + 2 * PREFETCH_AHEAD) {
                        arena.prefetch_offset(ahead as usize);
                    }
                    if let Some(&ahead) = o.get(pos + PREFETCH_AHEAD) {
                        arena.prefetch(ahead as usize);
                    }
                    o[pos] as usize
                }
                None => pos,
            };
            let row = arena.row(i);
            let row = match (standardizer, row) {
                (None, r) => r,
                (Some(s), Row::Dense(x)) => {
                    s.apply_dense(x, scaled);
                    Row::Dense(scaled)
                }
                (Some(s), Row::Sparse { indices, values }) => {
                    assert!(!s.center, "sparse rows must not be centered");
                    s.apply_sparse(indices, values, scaled);
                    Row::Sparse {
                        indices,
                        values: scaled,
                    }
                }
            };
            self.step(row, arena.label(i))?;
        }
        Ok(())
    }

    /// Starts loading the weights a sparse row will use: in a model of millions of features
    /// each is a cache miss otherwise.
    #[inline]
    fn prefetch_weights(&self, indices: &[u32]) {
        let d = self.model.n_features;
        for k in 0..self.model.n_outputs {
            let w = &self.model.weights[k * d..(k + 1) * d];
            for &j in indices {
                if let Some(x) = w.get(j as usize) {
                    prefetch_l2(x);
                }
            }
        }
    }

    /// Flushes the partial mini-batch, brings every coordinate up to date and
    /// returns the epoch's statistics.
    pub fn finish_epoch(&mut self) -> Result<EpochStats, TrainError> {
        self.flush_batch();
        self.sync();
        let n = self.tuples;
        let mean_loss = if n > 0 { self.loss_sum / n as f64 } else { 0.0 };
        let w = &self.model.weights;
        let mut loss = mean_loss + 0.5 * self.config.l2 * crate::model::dot(w, w);
        if self.config.l1 != 0.0 {
            loss += self.config.l1 * w.iter().map(|v| v.abs()).sum::<f64>();
        }
        let finite = loss.is_finite()
            && self.model.bias.iter().all(|v| v.is_finite())
            && w.iter().all(|v| v.is_finite());
        if !finite {
            return Err(TrainError::Diverged { epoch: self.epoch });
        }
        let kind = self.config.kind;
        let accuracy = kind.is_classifier().then(|| {
            if n > 0 {
                self.correct as f64 / n as f64
            } else {
                0.0
            }
        });
        let r2 = (kind == ModelKind::Linear && n > 0).then(|| {
            if self.y_m2 > 0.0 {
                1.0 - self.sse / self.y_m2
            } else if self.sse == 0.0 {
                1.0
            } else {
                0.0
            }
        });
        Ok(EpochStats {
            epoch: self.epoch,
            loss,
            accuracy,
            r2,
            tuples: n,
            learning_rate: self.lr,
        })
    }

    /// The model, brought up to date (O(d·K) if sparse steps left
    /// regularization pending, else free). Mid-epoch it excludes the partial
    /// mini-batch.
    pub fn model(&mut self) -> &LinearModel {
        self.sync();
        &self.model
    }

    /// The up-to-date model, consuming the trainer.
    pub fn into_model(mut self) -> LinearModel {
        self.sync();
        self.model
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Weight coordinates updated so far (eager updates, lazy catch-ups and
    /// syncs): a deterministic measure of training cost.
    pub fn coordinate_updates(&self) -> u64 {
        self.work
    }

    /// Binary kinds: `(negative, positive)`, the raw label values mapped to -1
    /// and +1. None unless two distinct values have been seen (or given).
    pub fn label_map(&self) -> Option<(f64, f64)> {
        match self.labels {
            Labels::Two { neg, pos } => Some((neg, pos)),
            _ => None,
        }
    }

    /// Binary kinds: distinct raw label values seen so far, ascending (0, 1 or
    /// 2 of them; given `label_values` count as seen). Empty for other kinds.
    pub fn labels_seen(&self) -> Vec<f64> {
        match self.labels {
            Labels::None => Vec::new(),
            Labels::One { value, .. } => vec![value],
            Labels::Two { neg, pos } if neg < pos => vec![neg, pos],
            Labels::Two { neg, pos } => vec![pos, neg],
        }
    }

    /// One SGD step (or mini-batch accumulation) on one tuple. Always inlined, as is
    /// `update`: with two `train_rows` loops LLVM stopped inlining them, and the calls cost
    /// a dense tuple ~25 instructions (valgrind).
    #[inline(always)]
    fn step(&mut self, row: Row, raw_label: f64) -> Result<(), TrainError> {
        let kind = self.config.kind;
        let (y, class) = match kind {
            ModelKind::Svm | ModelKind::Logistic => {
                let y = self.map_label(raw_label)?;
                (y, usize::from(y > 0.0))
            }
            ModelKind::Linear => {
                if !raw_label.is_finite() {
                    return Err(TrainError::InvalidLabel {
                        value: raw_label,
                        kind,
                    });
                }
                (raw_label, 0)
            }
            ModelKind::Softmax => {
                let ok =
                    raw_label >= 0.0 && raw_label < MAX_CLASSES as f64 && raw_label.fract() == 0.0;
                if !ok {
                    return Err(TrainError::InvalidLabel {
                        value: raw_label,
                        kind,
                    });
                }
                let c = raw_label as usize;
                if c >= self.model.n_outputs {
                    self.grow_classes(c + 1)?;
                }
                (raw_label, c)
            }
        };
        let mut gz = std::mem::take(&mut self.gz);
        gz.clear();
        match row {
            Row::Sparse { indices, values } if self.scaled_weights => {
                let dot = sparse_dot(&self.model.weights, indices, values);
                gz.push(self.scale * dot + self.model.bias[0]);
            }
            Row::Sparse { indices, values } if self.lazy && self.model.n_outputs == 1 => {
                // One pass: catch each coordinate up, then use it (same
                // summation order as `Row::dot`).
                let (step, k_s, k_c) = (self.step, self.shrink(), self.lr * self.config.l1);
                let w = &mut self.model.weights[..];
                let last = &mut self.last[..];
                let mut z = 0.0;
                for (&j, &v) in indices.iter().zip(values) {
                    let j = j as usize;
                    let k = step - last[j];
                    if k != 0 {
                        last[j] = step;
                        if w[j] != 0.0 {
                            w[j] = pending_reg(w[j], k, k_s, k_c);
                            self.work += 1;
                        }
                    }
                    z += w[j] * v;
                }
                gz.push(z + self.model.bias[0]);
            }
            _ => {
                if let Row::Sparse { indices, .. } = row {
                    self.catch_up(indices);
                }
                gz.extend((0..self.model.n_outputs).map(|k| self.model.output(k, row)));
            }
        }
        if !gz.iter().all(|z| z.is_finite()) {
            self.gz = gz;
            return Err(TrainError::Diverged { epoch: self.epoch });
        }
        let weight = self
            .config
            .class_weights
            .as_ref()
            .filter(|_| kind.is_classifier())
            .map(|w| w.get(class).copied().unwrap_or(1.0));
        let loss = match kind {
            ModelKind::Svm | ModelKind::Logistic => {
                let z = gz[0];
                if sign(z) == y {
                    self.correct += 1;
                }
                if z == 0.0 && matches!(self.labels, Labels::One { .. }) {
                    self.provisional_ties += 1;
                }
                let (loss, dloss) = kind.loss_and_dloss_dz(z, y);
                gz[0] = dloss;
                loss
            }
            ModelKind::Linear => {
                let z = gz[0];
                let r = z - y;
                self.sse += r * r;
                let n = (self.tuples + 1) as f64;
                let delta = y - self.y_mean;
                self.y_mean += delta / n;
                self.y_m2 += delta * (y - self.y_mean);
                gz[0] = kind.dloss_dz(z, y);
                kind.loss(z, y)
            }
            ModelKind::Softmax => {
                if argmax(&gz) == Some(class) {
                    self.correct += 1;
                }
                let loss = softmax_loss(&mut gz, class);
                gz[class] -= 1.0;
                loss
            }
        };
        match weight {
            // Skipped without weights: keeps the unweighted arithmetic exact.
            Some(c) => {
                self.loss_sum += c * loss;
                gz.iter_mut().for_each(|g| *g *= c);
            }
            None => self.loss_sum += loss,
        }
        self.tuples += 1;

        if self.config.batch_size == 1 {
            self.update(row, &gz);
        } else {
            self.accumulate(row, &gz);
            self.batch_count += 1;
            if self.batch_count == self.config.batch_size {
                self.flush_batch();
            }
        }
        self.gz = gz;
        Ok(())
    }

    /// Plain SGD update with the output gradients `gz`.
    #[inline(always)]
    fn update(&mut self, row: Row, gz: &[f64]) {
        let any_grad = gz.iter().any(|&g| g != 0.0);
        if !any_grad && !self.lazy {
            return; // e.g. hinge outside the margin: nothing changes
        }
        let (lr, l2, l1) = (self.lr, self.config.l2, self.config.l1);
        let shrink = 1.0 - lr * l2;
        let c = lr * l1;
        let d = self.model.n_features;
        let w = &mut self.model.weights;
        match row {
            Row::Dense(x) => {
                for (k, &g) in gz.iter().enumerate() {
                    let step = lr * g;
                    let wk = &mut w[k * d..(k + 1) * d];
                    if l2 == 0.0 {
                        for (wj, &xj) in wk.iter_mut().zip(x) {
                            *wj -= step * xj;
                        }
                    } else {
                        for (wj, &xj) in wk.iter_mut().zip(x) {
                            *wj = *wj * shrink - step * xj;
                        }
                    }
                    if l1 != 0.0 {
                        wk.iter_mut().for_each(|wj| *wj = clip(*wj, c));
                    }
                }
                self.work += (gz.len() * d) as u64;
            }
            Row::Sparse { indices, values } if self.scaled_weights => {
                // w ← w·shrink − lr·g·x for every coordinate, as scale ← scale·shrink and
                // v ← v − lr·g·x / scale on the row's coordinates only.
                if l2 != 0.0 {
                    self.scale *= shrink;
                    self.pending = true;
                }
                if any_grad {
                    sparse_axpy(w, -(lr * gz[0] / self.scale), indices, values);
                    self.work += indices.len() as u64;
                }
                if self.scale < MIN_SCALE {
                    self.sync();
                }
            }
            Row::Sparse { indices, values } => {
                if any_grad && gz.len() == 1 {
                    // The common case, with hoisted branches and plain slices.
                    let step = lr * gz[0];
                    let next = self.step + 1;
                    let last = &mut self.last[..];
                    let w = &mut w[..];
                    match (l2 != 0.0, l1 != 0.0) {
                        (false, false) => {
                            for (&j, &v) in indices.iter().zip(values) {
                                w[j as usize] -= step * v;
                            }
                        }
                        (true, false) => {
                            for (&j, &v) in indices.iter().zip(values) {
                                let j = j as usize;
                                w[j] = w[j] * shrink - step * v;
                                last[j] = next;
                            }
                        }
                        (has_l2, true) => {
                            for (&j, &v) in indices.iter().zip(values) {
                                let j = j as usize;
                                let wj = if has_l2 {
                                    w[j] * shrink - step * v
                                } else {
                                    w[j] - step * v
                                };
                                w[j] = clip(wj, c);
                                last[j] = next;
                            }
                        }
                    }
                    self.work += indices.len() as u64;
                } else if any_grad {
                    for (&j, &v) in indices.iter().zip(values) {
                        let j = j as usize;
                        for (k, &g) in gz.iter().enumerate() {
                            let wj = &mut w[k * d + j];
                            let step = lr * g;
                            if l2 == 0.0 {
                                *wj -= step * v;
                            } else {
                                *wj = *wj * shrink - step * v;
                            }
                            if l1 != 0.0 {
                                *wj = clip(*wj, c);
                            }
                        }
                        if self.lazy {
                            self.last[j] = self.step + 1;
                        }
                    }
                    self.work += (gz.len() * indices.len()) as u64;
                }
                // Everything else falls one step behind.
                if self.lazy {
                    self.step += 1;
                    self.pending = true;
                }
            }
        }
        if self.config.fit_intercept {
            for (b, &g) in self.model.bias.iter_mut().zip(gz) {
                *b -= lr * g;
            }
        }
    }

    /// Adds one tuple's gradient to the mini-batch sums.
    #[inline]
    fn accumulate(&mut self, row: Row, gz: &[f64]) {
        let d = self.model.n_features;
        if let Row::Dense(_) = row {
            self.batch_dense = true;
        }
        if !gz.iter().any(|&g| g != 0.0) {
            return;
        }
        match row {
            Row::Dense(x) => {
                for (k, &g) in gz.iter().enumerate() {
                    for (sj, &xj) in self.grad_sum[k * d..(k + 1) * d].iter_mut().zip(x) {
                        *sj += g * xj;
                    }
                }
            }
            Row::Sparse { indices, values } => {
                for (&j, &v) in indices.iter().zip(values) {
                    let ju = j as usize;
                    if !self.touched_mark[ju] {
                        self.touched_mark[ju] = true;
                        self.touched.push(j);
                    }
                    for (k, &g) in gz.iter().enumerate() {
                        self.grad_sum[k * d + ju] += g * v;
                    }
                }
            }
        }
        for (s, &g) in self.grad_bias_sum.iter_mut().zip(gz) {
            *s += g;
        }
        self.batch_has_grad = true;
    }

    /// Applies the accumulated mini-batch, averaged over its actual size.
    fn flush_batch(&mut self) {
        if self.batch_count == 0 {
            return;
        }
        let (lr, l2, l1) = (self.lr, self.config.l2, self.config.l1);
        let n = self.batch_count as f64;
        let shrink = 1.0 - lr * l2;
        let c = lr * l1;
        let d = self.model.n_features;
        let outputs = self.model.n_outputs;
        if self.batch_dense {
            if self.batch_has_grad || self.lazy {
                self.sync();
                let w = &mut self.model.weights;
                for (wj, &sj) in w.iter_mut().zip(&self.grad_sum) {
                    *wj = *wj * shrink - lr * (sj / n);
                }
                if l1 != 0.0 {
                    w.iter_mut().for_each(|wj| *wj = clip(*wj, c));
                }
                self.work += w.len() as u64;
                self.update_bias_from_batch(n);
            }
        } else if self.batch_has_grad || self.lazy {
            // Touched coordinates were caught up when their tuples were seen
            // (`step` does not move within a batch).
            let w = &mut self.model.weights;
            for &j in &self.touched {
                let j = j as usize;
                for k in 0..outputs {
                    let i = k * d + j;
                    w[i] = w[i] * shrink - lr * (self.grad_sum[i] / n);
                    if l1 != 0.0 {
                        w[i] = clip(w[i], c);
                    }
                }
                if self.lazy {
                    self.last[j] = self.step + 1;
                }
            }
            self.work += (self.touched.len() * outputs) as u64;
            self.update_bias_from_batch(n);
            if self.lazy {
                self.step += 1;
                self.pending = true;
            }
        }
        self.reset_batch();
    }

    fn update_bias_from_batch(&mut self, n: f64) {
        if self.config.fit_intercept {
            let lr = self.lr;
            for (b, &s) in self.model.bias.iter_mut().zip(&self.grad_bias_sum) {
                *b -= lr * (s / n);
            }
        }
    }

    fn reset_batch(&mut self) {
        let d = self.model.n_features;
        if self.batch_has_grad {
            if self.batch_dense {
                self.grad_sum.iter_mut().for_each(|v| *v = 0.0);
            } else {
                for &j in &self.touched {
                    for k in 0..self.model.n_outputs {
                        self.grad_sum[k * d + j as usize] = 0.0;
                    }
                }
            }
        }
        for &j in &self.touched {
            self.touched_mark[j as usize] = false;
        }
        self.touched.clear();
        self.grad_bias_sum.iter_mut().for_each(|v| *v = 0.0);
        self.batch_count = 0;
        self.batch_has_grad = false;
        self.batch_dense = false;
    }

    /// Lazy regularization: brings the coordinates of `indices` up to date by
    /// applying the decay/clipping of the steps they missed. The learning rate
    /// is constant within an epoch and every coordinate is synced before it
    /// changes, so k missed steps are k identical `w ← clip(w·(1-lr·l2), lr·l1)`.
    #[inline]
    fn catch_up(&mut self, indices: &[u32]) {
        if !self.lazy {
            return;
        }
        for &j in indices {
            self.catch_up_one(j as usize);
        }
    }

    #[inline]
    fn catch_up_one(&mut self, j: usize) {
        let k = self.step - self.last[j];
        if k == 0 {
            return;
        }
        self.last[j] = self.step;
        let s = 1.0 - self.lr * self.config.l2;
        let c = self.lr * self.config.l1;
        let d = self.model.n_features;
        for r in 0..self.model.n_outputs {
            let i = r * d + j;
            let w = self.model.weights[i];
            // Zero stays zero; most coordinates of a huge sparse model are zero,
            // which keeps the per-epoch sync a cheap scan.
            if w != 0.0 {
                self.model.weights[i] = pending_reg(w, k, s, c);
                self.work += 1;
            }
        }
    }

    /// Per-step L2 decay factor of this epoch.
    #[inline]
    fn shrink(&self) -> f64 {
        1.0 - self.lr * self.config.l2
    }

    /// Brings every coordinate up to date: O(d·K), once per epoch. A plain
    /// scan over `last` (zero weights stay zero), so it stays cheap for
    /// million-feature models.
    fn sync(&mut self) {
        if !self.pending {
            return;
        }
        if self.scaled_weights {
            let s = self.scale;
            let mut work = 0;
            for w in self.model.weights.iter_mut().filter(|w| **w != 0.0) {
                *w *= s;
                work += 1;
            }
            self.work += work;
            self.scale = 1.0;
            self.pending = false;
            return;
        }
        let step = self.step;
        let s = self.shrink();
        let c = self.lr * self.config.l1;
        let d = self.model.n_features;
        let outputs = self.model.n_outputs;
        let w = &mut self.model.weights[..];
        let mut work = 0;
        if outputs == 1 {
            for (wj, last) in w.iter_mut().zip(self.last.iter_mut()) {
                let k = step - *last;
                *last = step;
                if k != 0 && *wj != 0.0 {
                    *wj = pending_reg(*wj, k, s, c);
                    work += 1;
                }
            }
        } else {
            for (j, last) in self.last.iter_mut().enumerate() {
                let k = step - *last;
                if k == 0 {
                    continue;
                }
                *last = step;
                for r in 0..outputs {
                    let wi = &mut w[r * d + j];
                    if *wi != 0.0 {
                        *wi = pending_reg(*wi, k, s, c);
                        work += 1;
                    }
                }
            }
        }
        self.work += work;
        self.pending = false;
    }

    /// Sparse data with larger indices than seen so far: new zero weights.
    fn grow_features(&mut self, new_d: usize) -> Result<(), TrainError> {
        let old_d = self.model.n_features;
        let outputs = self.model.n_outputs;
        let oom = |_| TrainError::OutOfMemory {
            bytes: (new_d * 8) as u64,
        };
        // Every buffer first, so a failure leaves the model as it was.
        if self.config.batch_size > 1 {
            widen(&mut self.grad_sum, outputs, old_d, new_d)?;
            try_resize(&mut self.touched_mark, new_d, false).map_err(oom)?;
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
    fn grow_classes(&mut self, new_k: usize) -> Result<(), TrainError> {
        let d = self.model.n_features;
        let oom = |_| TrainError::OutOfMemory {
            bytes: (new_k * d * 8) as u64,
        };
        if self.config.batch_size > 1 {
            try_resize(&mut self.grad_sum, new_k * d, 0.0).map_err(oom)?;
        }
        try_resize(&mut self.model.weights, new_k * d, 0.0).map_err(oom)?;
        self.model.bias.resize(new_k, 0.0);
        self.grad_bias_sum.resize(new_k, 0.0);
        self.model.n_outputs = new_k;
        Ok(())
    }

    /// Maps a raw label to ±1, learning the mapping as values arrive.
    #[inline]
    fn map_label(&mut self, raw: f64) -> Result<f64, TrainError> {
        match self.labels {
            Labels::Two { neg, pos } => {
                if raw == neg {
                    Ok(-1.0)
                } else if raw == pos {
                    Ok(1.0)
                } else {
                    let (a, b) = if neg < pos { (neg, pos) } else { (pos, neg) };
                    Err(TrainError::TooManyLabels {
                        values: [a, b, raw],
                    })
                }
            }
            Labels::One { value, y } => {
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
                self.labels = Labels::Two { neg, pos };
                Ok(if raw == neg { -1.0 } else { 1.0 })
            }
            Labels::None => {
                if raw.is_nan() {
                    return Err(TrainError::TooManyLabels {
                        values: [f64::NAN; 3],
                    });
                }
                // Guess: labels like -1/0/false are usually the negative class.
                let y = if raw <= 0.0 { -1.0 } else { 1.0 };
                self.labels = Labels::One { value: raw, y };
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
    fn flip(&mut self, wrong_y: f64) {
        for w in &mut self.model.weights {
            *w = -*w;
        }
        for b in &mut self.model.bias {
            *b = -*b;
        }
        for s in &mut self.grad_sum {
            *s = -*s;
        }
        for s in &mut self.grad_bias_sum {
            *s = -*s;
        }
        // z == 0 predicts +1 in both runs, so ties are the one place where
        // "correct" is not symmetric: they were right iff the provisional y was +1.
        if wrong_y > 0.0 {
            self.correct -= self.provisional_ties;
        } else {
            self.correct += self.provisional_ties;
        }
        self.provisional_ties = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_reg_matches_repeated_steps() {
        for &(w, s, c) in &[
            (1.5, 0.99, 0.0),
            (-2.0, 0.97, 0.0),
            (3.0, 1.0, 0.01),
            (-3.0, 0.995, 0.004),
            (0.5, 0.9, 0.2),
            (1e-3, 1.0, 0.0),
        ] {
            for k in [0u64, 1, 5, 16, 17, 40, 200, 1000] {
                let mut eager: f64 = w;
                for _ in 0..k {
                    eager = clip(eager * s, c);
                }
                let lazy = pending_reg(w, k, s, c);
                assert!(
                    (lazy - eager).abs() <= 1e-12 * (1.0 + eager.abs()),
                    "w={w} s={s} c={c} k={k}: {lazy} vs {eager}"
                );
                if k <= 16 {
                    assert_eq!(lazy.to_bits(), eager.to_bits());
                }
            }
        }
    }

    /// Sparse rows over `d` features, ~`nnz` non-zeros each, labels from a fixed hyperplane.
    fn sparse_rows(n: usize, d: u32, nnz: u32, seed: u64) -> TupleArena {
        let mut s = seed;
        let mut next = move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut arena = TupleArena::new_sparse(n, n * nnz as usize);
        for _ in 0..n {
            let mut indices: Vec<u32> = (0..nnz).map(|_| next() % d).collect();
            indices.sort_unstable();
            indices.dedup();
            let values: Vec<f64> = indices.iter().map(|_| next() as f64 / 2e9 - 1.0).collect();
            let z: f64 = indices.iter().zip(&values).map(|(&j, v)| (j % 7) as f64 * v - 1.5 * v).sum();
            arena.push_sparse(if z > 0.0 { 1.0 } else { 0.0 }, &indices, &values);
        }
        arena
    }

    #[test]
    fn scaled_weights_equal_per_coordinate_catch_up() {
        // Many steps, several epochs (a new lr each) and lr·l2 large enough that the scale is
        // folded into the weights within an epoch: the scale trick must track the lazy
        // per-coordinate path, which is forced on the second trainer (coordinates miss ~17
        // steps between uses: both the stepwise and the closed-form catch-up run).
        let (n, d) = (6000, 200);
        let arena = sparse_rows(n, d, 12, 7);
        for kind in [ModelKind::Svm, ModelKind::Logistic, ModelKind::Linear] {
            let mut config = TrainConfig::new(kind);
            config.learning_rate = 0.2;
            config.l2 = 0.2;
            assert!((1.0 - 0.2 * 0.2f64).powi(n as i32) < MIN_SCALE, "no fold would happen");
            let mut scaled = Trainer::new(config.clone(), 0);
            let mut per_coordinate = Trainer::new(config, 0);
            assert!(scaled.scaled_weights);
            per_coordinate.scaled_weights = false;
            for epoch in 1..=3 {
                for t in [&mut scaled, &mut per_coordinate] {
                    t.start_epoch(epoch);
                    t.train_buffer(&arena, None).unwrap();
                }
                let (a, b) = (scaled.finish_epoch().unwrap(), per_coordinate.finish_epoch().unwrap());
                assert!((a.loss - b.loss).abs() <= 1e-9 * (1.0 + b.loss.abs()), "{kind:?} {a:?} {b:?}");
                assert_eq!(a.accuracy, b.accuracy, "{kind:?}");
            }
            let (a, b) = (scaled.into_model(), per_coordinate.into_model());
            let scale = b.weights.iter().fold(0.0f64, |m, w| m.max(w.abs()));
            assert!(scale > 1e-3, "{kind:?}: the model learned something");
            for (x, y) in a.weights.iter().chain(&a.bias).zip(b.weights.iter().chain(&b.bias)) {
                assert!((x - y).abs() <= 1e-9 * scale, "{kind:?}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn schedules() {
        let e = LrSchedule::Exponential { decay: 0.5 };
        assert_eq!(e.learning_rate(0.8, 1), 0.8);
        assert_eq!(e.learning_rate(0.8, 3), 0.2);
        assert_eq!(LrSchedule::Constant.learning_rate(0.8, 7), 0.8);
        assert_eq!(LrSchedule::InverseSqrt.learning_rate(0.8, 1), 0.8);
        assert_eq!(LrSchedule::InverseSqrt.learning_rate(0.8, 4), 0.4);
        assert!((LrSchedule::InverseSqrt.learning_rate(1.0, 2) - 0.5f64.sqrt()).abs() < 1e-15);
        for name in LrSchedule::NAMES {
            assert!([LrSchedule::Constant, e, LrSchedule::InverseSqrt]
                .iter()
                .any(|s| s.name() == name));
        }
    }
}
