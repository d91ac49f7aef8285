//! Pure-Rust ML core of corgipile: tuple storage (dense and sparse), linear
//! models (svm, logistic, linear, softmax), SGD training with lazy sparse
//! regularization, standardization, evaluation metrics, CorgiPile shuffling
//! and parameter validation. No PostgreSQL dependency, so everything here is
//! unit-tested with plain `cargo test`.

pub mod arena;
pub mod limits;
pub mod metrics;
pub mod model;
pub mod params;
pub mod shuffle;
pub mod stats;
pub mod trainer;

pub use arena::{validate_sparse, SparseError, TupleArena, MAX_FEATURES};
pub use metrics::{
    BinaryMetrics, BinaryReport, ClassReport, MulticlassMetrics, MulticlassReport,
    RegressionMetrics, RegressionReport,
};
pub use model::{dot, LinearModel, ModelKind, Row};
pub use params::{
    BlockSize, BufferSize, ClassWeight, Features, ParamError, ScheduleKind, ShuffleMode,
    TrainParams, Validation,
};
pub use shuffle::{block_order, split_blocks, TupleShuffler};
pub use stats::{balanced_class_weights, FeatureStats, Standardizer};
pub use trainer::{
    EpochStats, InterruptCheck, LrSchedule, TrainConfig, TrainError, Trainer, MAX_CLASSES,
};
