//! Pure-Rust ML core of corgipile: tuple storage (dense and sparse), the model families
//! (linear models, networks, factorization machines) behind one trait, SGD training with lazy
//! sparse regularization, the training policy every driver follows, standardization,
//! evaluation metrics, CorgiPile shuffling and parameter validation. No PostgreSQL dependency,
//! so everything here is unit-tested with plain `cargo test`.
//!
//! Modules:
//! - [`arena`]: [`TupleArena`], contiguous storage of decoded dense or sparse rows, and
//!   validation of the user's sparse rows.
//! - [`capabilities`]: what combines with what: one table of every refused combination.
//! - [`drift`]: today's rows counted in a model's training profile bins, and the distances
//!   (population stability index, Jensen–Shannon, L-infinity) for `corgipile_drift`.
//! - [`divergence`]: when a training has diverged (one rule for one server and for shards).
//! - [`explain`]: per-prediction explanations: each input column's share of a decision value
//!   against the baseline row (exact for linear models, integrated gradients for networks).
//! - [`export`]: a trained model as the text of a plain PL/pgSQL function that scores a row
//!   as the model does (its preprocessing, then its arithmetic).
//! - [`family`]: which family (linear, network, factorization machine) each kind belongs to.
//! - [`fm`]: factorization machines (`fm`, `fm_regression`): pairs of features weighed by
//!   their factors' dot products, trained as networks are.
//! - [`learner`]: [`Family`](learner::Family) (what a kind's trainer and trained model are,
//!   asked instead of matching on the kind) and [`Learner`](learner::Learner), any family's
//!   trainer.
//! - [`fit`]: a training's policy for every driver: which learner is which, what happens
//!   after each epoch (patience, stopping, the NOTICE lines), what each learner ends as.
//! - [`hash`]: the hand-written hash functions (FNV-1a, splitmix64, the finalizers).
//! - [`importance`]: permutation importance of input columns.
//! - [`inference`]: standard errors and p-values of linear and logistic models (Newton passes
//!   to the maximum-likelihood estimate, the information matrix, normal and t tails).
//! - [`limits`]: model memory accounting and fallible allocation.
//! - [`metrics`]: streaming binary, multiclass and regression metrics.
//! - [`model`]: the model kinds (each a family and an output head), the heads (their losses,
//!   predictions and probabilities: [`model::head`]) and [`LinearModel`].
//! - [`moments`]: [`Welford`], the one running mean/variance (and Chan's merge).
//! - [`network`]: multilayer perceptrons (`mlp`, `mlp_regression`) and the gradient trainer
//!   they share with factorization machines.
//! - [`params`]: the training parameters (one table declares them all), their JSON form,
//!   and buffer/block sizing.
//! - [`prefetch`]: hints that bring a buffer's next rows into cache.
//! - [`preprocess`]: table columns (numbers, text, arrays) → features: the statistics
//!   pass, imputation, one-hot and hashed categories, scaling.
//! - [`row`]: [`Row`], a dense or sparse row, and the dot kernels.
//! - [`scoring`]: validation statistics and the evaluation report of a model on rows.
//! - [`shuffle`]: block orders, tuple shuffles and the baselines' buffers.
//! - [`standardize`]: [`Standardizer`], feature scaling and its folding into models.
//! - [`stats`]: feature statistics, standardization and balanced class weights.
//! - [`streams`]: the sliding-window and reservoir baselines' buffers.
//! - [`trained`]: [`Model`](trained::Model), a trained model of any family, and its stored
//!   form.
//! - [`trainer`]: the SGD [`Trainer`] (label mapping, lazy regularization, mini-batches).
//! - [`trials`]: learners side by side on the same buffers (a search, folds, groups).
//! - [`wire`]: JSON from other processes and servers, parsed within a memory bound.

pub mod arena;
pub mod capabilities;
pub mod divergence;
pub mod drift;
pub mod explain;
pub mod export;
pub mod family;
pub mod fit;
pub mod fm;
pub mod hash;
pub mod importance;
pub mod inference;
pub mod learner;
pub mod limits;
mod memory;
pub mod metrics;
pub mod model;
pub mod moments;
pub mod network;
mod nonfinite;
pub mod params;
pub mod prefetch;
pub mod preprocess;
pub mod row;
pub mod scoring;
pub mod shuffle;
pub mod standardize;
pub mod stats;
pub mod streams;
#[cfg(test)]
mod test_rows;
pub mod trained;
pub mod trainer;
pub mod trials;
pub mod wire;

pub use arena::{validate_sparse, SparseError, TupleArena, MAX_FEATURES};
pub use metrics::{
    BinaryMetrics, BinaryReport, ClassReport, MulticlassMetrics, MulticlassReport,
    RegressionMetrics, RegressionReport,
};
pub use model::{LinearModel, ModelKind};
pub use moments::Welford;
pub use params::{
    BlockSize, BufferSize, ClassWeight, Features, ParamError, ScheduleKind, ShuffleMode,
    TrainParams, Validation,
};
pub use row::{dot, Row};
pub use scoring::{BinaryLabels, Evaluation, ValidationScore, ValidationStats};
pub use shuffle::{block_order, split_blocks, TupleShuffler};
pub use standardize::Standardizer;
pub use stats::{balanced_class_weights, FeatureStats};
pub use trainer::{
    EpochStats, InterruptCheck, LrSchedule, TrainConfig, TrainError, Trainer, MAX_CLASSES,
};
