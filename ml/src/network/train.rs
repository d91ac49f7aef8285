//! Training a model by gradients on mini-batches ([`Differentiable`]: a [`Network`], a
//! factorization machine) on CorgiPile's shuffled buffers: each buffer's rows, in the order
//! the tuple shuffle gave, in mini-batches; per-epoch statistics as the linear trainer reports
//! them (loss and accuracy or R² of each batch measured before its update), so the epoch loop
//! treats both alike. A batch does not span two buffers: a buffer's last rows form a smaller
//! batch.
//!
//! Regression learns a standardized target (`Target`), as scikit-learn's users are told to do:
//! a raw target of large scale would need a learning rate per table. Losses and predictions are
//! reported in the label's units.

use super::{Network, NetworkError, Optimizer, OptimizerKind, Workspace};

use crate::arena::TupleArena;
use crate::metrics::r2_score;
use crate::model::{Head, Labels};
use crate::moments::Welford;
use crate::row::Row;
use crate::standardize::Standardizer;
use crate::trainer::{EpochStats, Exchange, InterruptCheck, SharedModel, TrainError};

/// A regression target's standardization `y' = (y - mean) / scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Target {
    pub mean: f64,
    pub scale: f64,
}

impl Target {
    /// From the label's mean and standard deviation (a constant label keeps scale 1).
    pub fn new(mean: f64, std: f64) -> Target {
        Target {
            mean,
            scale: if std > 0.0 && std.is_finite() {
                std
            } else {
                1.0
            },
        }
    }

    pub fn standardize(&self, y: f64) -> f64 {
        (y - self.mean) / self.scale
    }

    pub fn unstandardize(&self, z: f64) -> f64 {
        z * self.scale + self.mean
    }
}

/// Floating-point operations between two looks at the stop flag: about 10 ms of arithmetic.
const FLOPS_BETWEEN_CHECKS: usize = 1 << 24;

/// A model [`GradientTrainer`] trains: flat parameters, a head, and the mean loss of a batch
/// with its gradient.
pub trait Differentiable: Send {
    /// A batch's buffers, allocated once, fallibly.
    type Workspace: Send;
    /// Every parameter, flat (what processes exchange and shards combine).
    fn params(&self) -> &[f64];
    fn params_mut(&mut self) -> &mut [f64];
    fn head(&self) -> Head;
    /// Outputs: classes (softmax) or 1.
    fn n_outputs(&self) -> usize;
    /// Which parameters are weights (L2 applies to them), not biases.
    fn is_weight(&self) -> Vec<bool>;
    /// The buffers of a batch of `batch` rows.
    fn workspace(&self, batch: usize) -> Result<Self::Workspace, NetworkError>;
    /// Part of a batch of `of_rows` rows: adds its share of the batch's mean loss gradient to
    /// the workspace's gradient (zeroed first when `first`) and returns its share of the mean
    /// loss (see [`Network::add_loss_and_gradient`]).
    fn add_loss_and_gradient(
        &self,
        rows: &[Row],
        labels: &[f64],
        weights: &[f64],
        of_rows: usize,
        first: bool,
        ws: &mut Self::Workspace,
    ) -> f64;
    /// The outputs of row `i` of the last part (probabilities, or the standardized value).
    fn outputs<'w>(&self, ws: &'w Self::Workspace, i: usize) -> &'w [f64];
    fn gradient(ws: &Self::Workspace) -> &[f64];
    /// The parameters the last batch's gradient can be non-zero on, when that is fewer than
    /// all (a batch of sparse rows touches a few features' parameters): the optimizer then
    /// steps those only (lazily: an untouched parameter's moments wait for its next gradient).
    /// None: every parameter.
    fn touched(&self, _ws: &Self::Workspace) -> Option<Vec<std::ops::Range<usize>>> {
        None
    }
    /// Multiply-adds of a row's loss and gradient (how many rows make a few milliseconds of
    /// work between looks at the stop flag).
    fn work_per_row(&self, _rows: &[Row]) -> usize {
        6 * self.params().len()
    }
}

impl Differentiable for Network {
    type Workspace = Workspace;
    fn params(&self) -> &[f64] {
        &self.params
    }
    fn params_mut(&mut self) -> &mut [f64] {
        &mut self.params
    }
    fn head(&self) -> Head {
        self.head
    }
    fn n_outputs(&self) -> usize {
        *self.sizes.last().expect("a network has an output layer")
    }
    fn is_weight(&self) -> Vec<bool> {
        Network::is_weight(self)
    }
    fn workspace(&self, batch: usize) -> Result<Workspace, NetworkError> {
        Workspace::new(self, batch)
    }
    fn add_loss_and_gradient(
        &self,
        rows: &[Row],
        labels: &[f64],
        weights: &[f64],
        of_rows: usize,
        first: bool,
        ws: &mut Workspace,
    ) -> f64 {
        Network::add_loss_and_gradient(self, rows, labels, weights, of_rows, first, ws)
    }
    fn outputs<'w>(&self, ws: &'w Workspace, i: usize) -> &'w [f64] {
        Network::outputs(self, ws, i)
    }
    fn gradient(ws: &Workspace) -> &[f64] {
        &ws.gradient
    }
}

/// A network's trainer.
pub type NetworkTrainer = GradientTrainer<Network>;

pub struct GradientTrainer<M: Differentiable> {
    net: M,
    workspace: M::Workspace,
    optimizer: Optimizer,
    is_weight: Vec<bool>,
    batch: usize,
    learning_rate: f64,
    target: Target,
    labels: Vec<f64>,
    /// Each batch row's weight on the loss (its class's weight), when classes are weighted.
    row_weights: Vec<f64>,
    class_weights: Option<Vec<f64>>,
    /// Rows are standardized on the way in (unless their buffer scaled them already).
    standardizer: Option<Standardizer>,
    /// The batch's standardized values: dense rows one after another, or each sparse row's
    /// values (`spans` says where each row's are).
    scaled: Vec<f64>,
    spans: Vec<(usize, usize)>,
    epoch: u32,
    // This epoch's sums, each batch measured before its update.
    loss_sum: f64,
    correct: u64,
    tuples: u64,
    sse: f64,
    y: Welford,
    interrupt: Option<InterruptCheck>,
    /// Training in several processes: the shared parameters this one exchanges with.
    exchange: Option<Exchange>,
}

impl<M: Differentiable> GradientTrainer<M> {
    /// A trainer of `net` with `batch` rows per step; `target` standardizes a regression
    /// label (ignored for classes). Every buffer it needs is allocated here, fallibly.
    pub fn try_new(
        net: M,
        optimizer: OptimizerKind,
        learning_rate: f64,
        l2: f64,
        batch: usize,
        target: Target,
    ) -> Result<GradientTrainer<M>, NetworkError> {
        let batch = batch.max(1);
        let workspace = net.workspace(batch)?;
        let optimizer = Optimizer::new(optimizer, learning_rate, l2, net.params().len())?;
        let mut labels = Vec::new();
        labels
            .try_reserve_exact(batch)
            .map_err(|_| NetworkError::OutOfMemory {
                bytes: batch as u64 * 8,
            })?;
        Ok(GradientTrainer {
            is_weight: net.is_weight(),
            net,
            workspace,
            optimizer,
            batch,
            learning_rate,
            target,
            labels,
            row_weights: Vec::new(),
            class_weights: None,
            standardizer: None,
            scaled: Vec::new(),
            spans: Vec::new(),
            epoch: 0,
            loss_sum: 0.0,
            correct: 0,
            tuples: 0,
            sse: 0.0,
            y: Welford::default(),
            interrupt: None,
            exchange: None,
        })
    }

    /// Rows are standardized by `s` before they reach the network (as the linear trainer
    /// does; an identity standardizer is skipped).
    pub fn set_standardizer(&mut self, s: Option<Standardizer>) {
        self.standardizer = s.filter(|s| !s.is_identity());
    }

    /// Each row's loss and gradient weighted by its class's weight (missing classes: 1).
    pub fn set_class_weights(&mut self, weights: Option<Vec<f64>>) {
        self.class_weights = weights;
    }

    /// The regression target's standardization (see [`Target`]).
    pub fn target(&self) -> Target {
        self.target
    }

    /// Called between batches: true stops the training with [`TrainError::Interrupted`].
    pub fn set_interrupt(&mut self, check: Option<InterruptCheck>) {
        self.interrupt = check;
    }

    /// Asks the interrupt check now (between pieces of work done elsewhere for this network,
    /// such as scoring a fold).
    pub fn check_interrupt(&mut self) -> Result<(), TrainError> {
        match self.interrupt.as_mut().is_some_and(|check| check()) {
            true => Err(TrainError::Interrupted),
            false => Ok(()),
        }
    }

    /// The step size from the next batch on.
    pub fn set_learning_rate(&mut self, learning_rate: f64) {
        self.learning_rate = learning_rate;
        self.optimizer.set_learning_rate(learning_rate);
    }

    /// Adam at learning rate 0.01, no L2, classes (the unit tests' trainer).
    #[cfg(test)]
    pub(crate) fn adam_for_tests(net: M, batch: usize) -> GradientTrainer<M> {
        GradientTrainer::try_new(
            net,
            OptimizerKind::Adam,
            0.01,
            0.0,
            batch,
            Target::new(0.0, 1.0),
        )
        .unwrap()
    }

    /// Continues with `optimizer`'s state (kept from an earlier round of the same training,
    /// e.g. a shard's); false, and nothing changed, if it does not fit this network. The
    /// learning rate stays this trainer's.
    pub fn resume_optimizer(&mut self, mut optimizer: Optimizer) -> bool {
        if !optimizer.fits(self.optimizer.kind(), self.net.params().len()) {
            return false;
        }
        optimizer.set_learning_rate(self.learning_rate);
        self.optimizer = optimizer;
        true
    }

    /// Corrects this round's steps for drift (see [`Optimizer::start_control`]).
    pub fn start_control(&mut self, correction: Vec<f64>) -> Result<bool, NetworkError> {
        self.optimizer.start_control(correction)
    }

    /// The optimizer's state, to resume in a later round (see `resume_optimizer`).
    pub fn into_optimizer(self) -> Optimizer {
        self.optimizer
    }

    /// Continues from these parameters (as many as the network has).
    pub fn set_parameters(&mut self, values: &[f64]) {
        self.net.params_mut().copy_from_slice(values);
    }

    pub fn network(&self) -> &M {
        &self.net
    }

    pub fn into_network(self) -> M {
        self.net
    }

    pub fn start_epoch(&mut self, epoch: u32) {
        self.epoch = epoch;
        self.loss_sum = 0.0;
        self.correct = 0;
        self.tuples = 0;
        self.sse = 0.0;
        self.y = Welford::default();
    }

    /// One buffer's rows in `order` (all of them in storage order without one), in batches.
    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        let n = order.map_or(arena.len(), <[u32]>::len);
        let at = |k: usize| order.map_or(k, |o| o[k] as usize);
        // Rows scaled in their buffer (TupleArena::scale_values) are used as they are.
        let standardizer = self
            .standardizer
            .take()
            .filter(|_| arena.scaled_rows() == 0);
        let result = (|| {
            let mut start = 0;
            while start < n {
                if self.interrupt.as_mut().is_some_and(|check| check()) {
                    return Err(TrainError::Interrupted);
                }
                let end = (start + self.batch).min(n);
                self.labels.clear();
                self.row_weights.clear();
                let classes = self.net.n_outputs();
                for k in start..end {
                    let y = arena.label(at(k));
                    if self.net.head() == Head::SOFTMAX && y as usize >= classes {
                        // The output layer has no unit for it (see TrainError::UnknownClass).
                        return Err(TrainError::UnknownClass { class: y, classes });
                    }
                    // A number is learnt standardized (`Target`), a class index as it is.
                    self.labels.push(match self.net.head().labels {
                        Labels::Number => self.target.standardize(y),
                        Labels::TwoClasses | Labels::Classes => y,
                    });
                    if let Some(w) = &self.class_weights {
                        self.row_weights
                            .push(w.get(y as usize).copied().unwrap_or(1.0));
                    }
                }
                let mut scaled = std::mem::take(&mut self.scaled);
                let mut rows: Vec<Row> = Vec::new();
                rows.try_reserve_exact(end - start)
                    .map_err(|_| TrainError::OutOfMemory {
                        bytes: (end - start) as u64 * 32,
                    })?;
                if let Some(s) = &standardizer {
                    scaled.clear();
                    self.spans.clear();
                    // The batch's values in one reservation, then each row appended in place
                    // (no vector per row; `scaled` keeps its capacity from batch to batch).
                    let n_values: usize = (start..end).map(|k| arena.row(at(k)).nnz()).sum();
                    scaled
                        .try_reserve(n_values)
                        .map_err(|_| TrainError::OutOfMemory {
                            bytes: n_values as u64 * 8,
                        })?;
                    for k in start..end {
                        let from = scaled.len();
                        match arena.row(at(k)) {
                            Row::Dense(x) => s.extend_dense(x, &mut scaled),
                            Row::Sparse { indices, values: v } => {
                                s.extend_sparse(indices, v, &mut scaled)
                            }
                        }
                        self.spans.push((from, scaled.len()));
                    }
                    for (k, &(from, to)) in (start..end).zip(&self.spans) {
                        rows.push(match arena.row(at(k)) {
                            Row::Dense(_) => Row::Dense(&scaled[from..to]),
                            Row::Sparse { indices, .. } => Row::Sparse {
                                indices,
                                values: &scaled[from..to],
                            },
                        });
                    }
                } else {
                    rows.extend((start..end).map(|k| arena.row(at(k))));
                }
                let stepped = self.step(&rows);
                drop(rows);
                self.scaled = scaled;
                stepped?;
                start = end;
            }
            Ok(())
        })();
        self.standardizer = standardizer.or(self.standardizer.take());
        result
    }

    /// One batch: its loss and correct predictions (before the update), then the update.
    fn step(&mut self, rows: &[Row]) -> Result<(), TrainError> {
        let b = rows.len();
        if self.exchange.as_mut().is_some_and(|x| x.due(b as u64)) {
            self.exchange()?;
        }
        // A wide network's batch is taken in chunks of rows whose gradients add up, so that
        // the stop flag is looked at every few milliseconds of arithmetic, however wide the
        // layers (cancel must not wait for a batch of seconds).
        let flops_per_row = self.net.work_per_row(rows).max(1);
        let chunk = (FLOPS_BETWEEN_CHECKS / flops_per_row).clamp(1, b.max(1));
        let mut loss = 0.0;
        for start in (0..b).step_by(chunk) {
            if start > 0 && self.interrupt.as_mut().is_some_and(|check| check()) {
                return Err(TrainError::Interrupted);
            }
            let end = (start + chunk).min(b);
            let weights = self.row_weights.get(start..end).unwrap_or(&[]);
            loss += self.net.add_loss_and_gradient(
                &rows[start..end],
                &self.labels[start..end],
                weights,
                b,
                start == 0,
                &mut self.workspace,
            );
            self.count(start, end);
        }
        if !loss.is_finite() {
            return Err(TrainError::Diverged { epoch: self.epoch });
        }
        let units = match self.net.head().labels {
            Labels::Number => self.target.scale * self.target.scale,
            Labels::TwoClasses | Labels::Classes => 1.0,
        };
        self.loss_sum += loss * units * b as f64;
        self.tuples += b as u64;
        let finite = match self.net.touched(&self.workspace) {
            None => {
                self.optimizer.step(
                    self.net.params_mut(),
                    M::gradient(&self.workspace),
                    &self.is_weight,
                );
                self.net.params().iter().all(|p| p.is_finite())
            }
            Some(ranges) => {
                self.optimizer.step_ranges(
                    self.net.params_mut(),
                    M::gradient(&self.workspace),
                    &self.is_weight,
                    &ranges,
                );
                let params = self.net.params();
                ranges
                    .into_iter()
                    .all(|r| params[r].iter().all(|p| p.is_finite()))
            }
        };
        if !finite {
            return Err(TrainError::Diverged { epoch: self.epoch });
        }
        Ok(())
    }

    /// Counts the batch's rows `start..end` (the last chunk forwarded) as predicted before the
    /// update: correct classes, or squared errors in the label's units.
    fn count(&mut self, start: usize, end: usize) {
        for (i, &y) in self.labels[start..end].iter().enumerate() {
            let out = self.net.outputs(&self.workspace, i);
            match self.net.head().labels {
                Labels::TwoClasses | Labels::Classes => {
                    let predicted = crate::model::argmax(out).unwrap_or(0);
                    self.correct += u64::from(predicted as f64 == y);
                }
                Labels::Number => {
                    let (z, y) = (
                        self.target.unstandardize(out[0]),
                        self.target.unstandardize(y),
                    );
                    self.sse += (z - y) * (z - y);
                    self.y.push(y);
                }
            }
        }
    }

    /// The epoch's statistics: mean loss (in the label's units), accuracy or R².
    /// Makes this trainer exchange its parameters with `shared` every `period` tuples (see
    /// `trainer::SharedModel`), and before the first batch of every epoch. `shared` holds the
    /// parameters every process starts from: this trainer's initial ones (the same seed
    /// draws the same weights in every process).
    pub fn set_exchange(&mut self, shared: SharedModel, period: u64) {
        self.exchange = Some(Exchange::new(shared, period, self.net.params()));
    }

    /// Exchanges now (if exchanging): adds this trainer's steps since its last exchange to the
    /// shared parameters and continues from the sum. The optimizer's state (Adam's moments)
    /// stays each process's own.
    pub fn exchange(&mut self) -> Result<(), TrainError> {
        match self.exchange.as_mut() {
            Some(x) => x.merge(self.net.params_mut().iter_mut()),
            None => Ok(()),
        }
    }

    /// At an epoch's start: exchange before its first batch.
    pub fn exchange_at_next_batch(&mut self) {
        if let Some(x) = self.exchange.as_mut() {
            x.at_next_tuple();
        }
    }

    pub fn finish_epoch(&mut self) -> EpochStats {
        let n = self.tuples.max(1) as f64;
        let classes = self.net.head() == Head::SOFTMAX;
        EpochStats {
            epoch: self.epoch,
            loss: self.loss_sum / n,
            accuracy: classes.then(|| self.correct as f64 / n),
            r2: (!classes && self.tuples > 0).then(|| r2_score(self.sse, self.y.m2())),
            tuples: self.tuples,
            learning_rate: self.learning_rate,
        }
    }
}

#[cfg(test)]
mod tests;
