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
//!
//! Files: this one holds [`Trainer`], its public methods and the per-tuple hot loop
//! (`step`); `config` the inputs and errors ([`TrainConfig`], [`LrSchedule`],
//! [`TrainError`]); `epoch` the epoch statistics; `labels` the binary label mapping
//! (provisional mapping and `flip`); `regularization` lazy L1/L2 (`catch_up`,
//! `pending_reg`, scaled weights, `sync`); `minibatch` the gradient sums of a
//! mini-batch and their flush; `update` the plain SGD update of one tuple (dense, sparse,
//! scaled weights); `growth` growing features and classes.

mod average;
mod combine;
mod config;
mod controls;
mod epoch;
mod exchange;
mod growth;
mod labels;
mod minibatch;
mod prepass;
mod regularization;
mod report;
mod run;
#[cfg(test)]
mod tests;
mod update;

pub use combine::{DeltaRounds, EpochPart, EpochTotals};
pub use config::{InterruptCheck, LrSchedule, TrainConfig, TrainError, MAX_CLASSES};
pub use controls::{unlike_shards, Controls};
pub use epoch::EpochStats;
pub(crate) use exchange::Exchange;
pub use exchange::{Gate, SharedModel, MIN_EXCHANGE_PERIOD};
pub use prepass::{normalizing_scaler, settle_labels, LabelsError, SettledLabels};
pub use report::{
    remaining_seconds, search_line, shard_line, table_header, table_line, ProgressLine,
};
pub use run::{converged, EpochRecord, LearnerRun, Stopped};

use crate::arena::TupleArena;
use crate::limits::try_filled;
use crate::model::{argmax, sign, softmax_loss, LinearModel};
use crate::model::{Labels, Loss};
use crate::prefetch::prefetch_l2;
use crate::row::{sparse_dot, Row};
use crate::stats::Standardizer;
use epoch::EpochSums;
use labels::LabelsSeen;
use minibatch::MiniBatch;
use regularization::pending_reg;

pub struct Trainer {
    config: TrainConfig,
    model: LinearModel,
    /// Binary kinds: what is known about the raw label values (see `labels`).
    labels: LabelsSeen,

    epoch: u32,
    lr: f64,
    /// This epoch's loss, accuracy and R² sums.
    sums: EpochSums,

    /// Scores, then gradients d loss / d output, of the current tuple.
    gz: Vec<f64>,
    /// Standardized values of the current tuple.
    scaled: Vec<f64>,
    /// The standardizer leaves every value as it is (see `Standardizer::is_identity`): rows
    /// are not scaled. Decided once: the check reads every feature's scale.
    identity_standardizer: bool,

    /// The partial mini-batch (see `minibatch`).
    batch: MiniBatch,

    /// Lazy regularization (see `regularization`; only when l2 or l1 != 0): `step` counts
    /// the sparse steps taken; coordinate j has had all steps before `last[j]` applied.
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

    /// Iterate averaging (see `average`), when configured.
    average: Option<average::Average>,

    /// Called every few hundred thousand multiply-adds inside a buffer; `true` stops the
    /// buffer with [`TrainError::Interrupted`] (cancel must not wait for a whole buffer).
    interrupt: Option<InterruptCheck>,
    /// Multiply-adds since the last interrupt check. Kept across calls: a search trains each
    /// learner on small chunks of a buffer (`Trials`), each far below WORK_BETWEEN_CHECKS, and
    /// a count that restarted every call never reached a check.
    work_since_check: usize,

    /// Training in several processes: the shared model this one exchanges with (see
    /// `exchange`).
    exchange: Option<exchange::Exchange>,
}

/// Multiply-adds between two interrupt checks: well under a millisecond of work.
pub const WORK_BETWEEN_CHECKS: usize = 1 << 18;

/// How many tuples ahead of SGD a shuffled buffer is prefetched: enough loads in flight to
/// cover memory latency (~100 ns) with steps of tens of ns each. Measured on a 4.5M x 18 table
/// (svm, 92 MB buffers): the SGD thread's CPU per 5 epochs 0.85-0.98 s at 8 ahead, 0.70-0.87 s
/// at 16, no better at 32.
const PREFETCH_AHEAD: usize = 16;

/// How many tuples ahead the weights of a sparse row are prefetched: its indices, prefetched
/// `PREFETCH_AHEAD` tuples ahead, have arrived by then.
const WEIGHTS_AHEAD: usize = 4;

/// Sparse models with at least this many weights (256 KiB) get them prefetched; smaller ones
/// stay in cache, where the prefetches cost more than they save (measured: ~10% of a step
/// over 40 features).
const PREFETCH_WEIGHTS_MIN: usize = 1 << 15;

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
        let average_from = config.average_from_epoch;
        let outputs = usize::from(!kind.has_class_outputs());
        let mini = config.batch_size > 1;
        let lazy = config.l2 != 0.0 || config.l1 != 0.0;
        let identity_standardizer = config
            .standardizer
            .as_ref()
            .is_some_and(|s| s.is_identity());
        // lr·l2 < 1 keeps every per-step factor positive (the schedules never raise lr).
        let scaled_weights = config.l1 == 0.0
            && config.learning_rate * config.l2 < 1.0
            && config.batch_size == 1
            && !kind.has_class_outputs();
        let labels = match config.label_values {
            Some((neg, pos)) => {
                assert!(
                    neg != pos && !neg.is_nan() && !pos.is_nan(),
                    "bad label_values"
                );
                LabelsSeen::Two { neg, pos }
            }
            None => LabelsSeen::None,
        };
        let oom = |_| TrainError::OutOfMemory {
            bytes: (n_features as u64).saturating_mul(8 * outputs as u64),
        };
        let zeros = |n: usize, wanted: bool| {
            if wanted {
                try_filled(n, 0.0)
            } else {
                Ok(Vec::new())
            }
        };
        let mut t = Trainer {
            model: LinearModel {
                kind,
                n_features,
                n_outputs: outputs,
                weights: try_filled(n_features * outputs, 0.0).map_err(oom)?,
                bias: vec![0.0; outputs],
            },
            // Only mini-batches need the accumulators.
            batch: MiniBatch {
                grad_sum: zeros(n_features * outputs, mini).map_err(oom)?,
                grad_bias_sum: vec![0.0; outputs],
                touched_mark: if mini {
                    try_filled(n_features, false).map_err(oom)?
                } else {
                    Vec::new()
                },
                ..MiniBatch::default()
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
            sums: EpochSums::default(),
            gz: Vec::new(),
            scaled: Vec::new(),
            identity_standardizer,
            step: 0,
            pending: false,
            work: 0,
            average: average_from.map(average::Average::new),
            interrupt: None,
            work_since_check: 0,
            exchange: None,
        };
        t.start_epoch(1);
        Ok(t)
    }

    /// Installs (or removes) the check `train_buffer` calls between rows, often enough that
    /// a stop request is seen within a millisecond or so of work whatever one row costs.
    pub fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        self.interrupt = check;
    }

    /// Asks the interrupt check now (work done for this learner elsewhere, such as a search's
    /// thread training many learners, adds up to a check's worth).
    pub fn check_interrupt(&mut self) -> Result<(), TrainError> {
        match self.interrupt.as_mut().is_some_and(|check| check()) {
            true => Err(TrainError::Interrupted),
            false => Ok(()),
        }
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
        self.sums = EpochSums::default();
        self.reset_batch();
        // Several processes: continue from the shared model (the others' last epoch).
        self.exchange_at_next_tuple();
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
            // A permutation of the arena, or of some of its rows (a fold's learner skips the
            // rows it holds out).
            assert!(
                order.len() <= arena.len(),
                "order must list rows of the arena"
            );
        }
        // Taken out so rows may borrow them while `step` borrows self.
        let standardizer = self.config.standardizer.take();
        // Rows scaled in their buffer (TupleArena::scale_values) are used as they are.
        let scale_here = match arena.scaled_rows() {
            0 => standardizer
                .as_ref()
                .filter(|_| !self.identity_standardizer),
            k => {
                assert_eq!(k, arena.len(), "an arena of scaled and unscaled rows");
                None
            }
        };
        let mut scaled = std::mem::take(&mut self.scaled);
        // Separate loops, so dense rows and small models pay nothing for the weight prefetch.
        let result = if arena.is_sparse() && self.model.weights.len() >= PREFETCH_WEIGHTS_MIN {
            self.train_rows::<true>(arena, order, scale_here, &mut scaled)
        } else {
            self.train_rows::<false>(arena, order, scale_here, &mut scaled)
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
        let n = order.map_or(arena.len(), <[u32]>::len);
        // An interrupt check every WORK_BETWEEN_CHECKS multiply-adds (softmax grows its
        // outputs as classes appear, so the cost of a row is read per row).
        let row_cost = 1 + if arena.is_sparse() {
            arena.nnz() / arena.len().max(1)
        } else {
            arena.n_features()
        };
        // A local copy in the hot loop (stored back below; an early return loses a count of
        // less than one check's work).
        let mut work_since_check = self.work_since_check;
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
                    if let Some(s) = standardizer {
                        s.prefetch_sparse(indices);
                    }
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
                    s.apply_sparse(indices, values, scaled);
                    Row::Sparse {
                        indices,
                        values: scaled,
                    }
                }
            };
            self.exchange_due()?;
            self.step(row, arena.label(i))?;
            self.average_step()?;
        }
        self.work_since_check = work_since_check;
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
        self.exchange()?;
        self.sample_average()?;
        let n = self.sums.tuples;
        let mean_loss = if n > 0 {
            self.sums.loss_sum / n as f64
        } else {
            0.0
        };
        let w = &self.model.weights;
        let mut loss = mean_loss + 0.5 * self.config.l2 * crate::row::dot(w, w);
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
        let accuracy = kind.is_classifier().then(|| self.sums.accuracy());
        let r2 = (!kind.is_classifier() && n > 0).then(|| self.sums.r2());
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

    /// Continues from `weights` and `bias` (a model of this trainer's shape, e.g. one combined
    /// from other trainers').
    pub fn set_model(&mut self, weights: &[f64], bias: &[f64]) {
        assert_eq!(weights.len(), self.model.weights.len(), "model shape");
        assert_eq!(bias.len(), self.model.bias.len(), "model shape");
        self.sync();
        self.model.weights.copy_from_slice(weights);
        self.model.bias.copy_from_slice(bias);
    }

    /// Continues from `weights` and `bias` (see `Learner::start_from`): a softmax model grows
    /// to their outputs first. False if they do not fit the model's shape.
    pub fn start_from(&mut self, weights: &[f64], bias: &[f64]) -> Result<bool, TrainError> {
        let outputs = bias.len();
        let d = self.model.n_features;
        if self.config.kind == crate::model::ModelKind::Softmax
            && outputs > self.model.n_outputs
            && weights.len() == outputs * d
        {
            self.grow_classes(outputs)?;
        }
        if weights.len() != self.model.weights.len() || outputs != self.model.bias.len() {
            return Ok(false);
        }
        self.set_model(weights, bias);
        Ok(true)
    }

    /// The trained model, consuming the trainer: the average of the iterates when averaging
    /// (see `average`), else the last iterate.
    pub fn into_model(mut self) -> LinearModel {
        self.take_result()
    }

    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Weight coordinates updated so far (eager updates, lazy catch-ups and
    /// syncs): a deterministic measure of training cost.
    pub fn coordinate_updates(&self) -> u64 {
        self.work
    }

    /// One SGD step (or mini-batch accumulation) on one tuple. Always inlined, as is
    /// `update`: with two `train_rows` loops LLVM stopped inlining them, and the calls cost
    /// a dense tuple ~25 instructions (valgrind).
    #[inline(always)]
    fn step(&mut self, row: Row, raw_label: f64) -> Result<(), TrainError> {
        let kind = self.config.kind;
        let (y, class) = match kind.labels() {
            Labels::TwoClasses => {
                let y = self.map_label(raw_label)?;
                (y, usize::from(y > 0.0))
            }
            Labels::Number => {
                if !raw_label.is_finite() {
                    return Err(TrainError::InvalidLabel {
                        value: raw_label,
                        kind,
                    });
                }
                (raw_label, 0)
            }
            Labels::Classes => {
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
        let head = kind.head();
        let loss = match (head.loss, head.labels) {
            (Loss::Scalar(f), Labels::TwoClasses) => {
                let z = gz[0];
                if sign(z) == y {
                    self.sums.correct += 1;
                }
                if z == 0.0 && matches!(self.labels, LabelsSeen::One { .. }) {
                    self.sums.provisional_ties += 1;
                }
                let (loss, dloss) = f.loss_and_dloss_dz(z, y);
                gz[0] = dloss;
                loss
            }
            (Loss::Scalar(f), _) => {
                let z = gz[0];
                let r = z - y;
                self.sums.sse += r * r;
                self.sums.y.push(y);
                gz[0] = f.dloss_dz(z, y);
                f.loss(z, y)
            }
            (Loss::CrossEntropy, _) => {
                if argmax(&gz) == Some(class) {
                    self.sums.correct += 1;
                }
                let loss = softmax_loss(&mut gz, class);
                gz[class] -= 1.0;
                loss
            }
        };
        match weight {
            // Skipped without weights: keeps the unweighted arithmetic exact.
            Some(c) => {
                self.sums.loss_sum += c * loss;
                gz.iter_mut().for_each(|g| *g *= c);
            }
            None => self.sums.loss_sum += loss,
        }
        self.sums.tuples += 1;

        if self.config.batch_size == 1 {
            self.update(row, &gz);
        } else {
            self.batch.accumulate(self.model.n_features, row, &gz);
            self.batch.count += 1;
            if self.batch.count == self.config.batch_size {
                self.flush_batch();
            }
        }
        self.gz = gz;
        Ok(())
    }
}
