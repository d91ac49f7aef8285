//! Pure-Rust ML core of corgipile: tuple storage, linear models, SGD training,
//! CorgiPile shuffling and parameter validation. No PostgreSQL dependency, so
//! everything here is unit-tested with plain `cargo test`.

pub mod arena;
pub mod model;
pub mod params;
pub mod shuffle;
pub mod trainer;

pub use arena::TupleArena;
pub use model::{dot, LinearModel, ModelKind};
pub use params::{BlockSize, BufferSize, ParamError, ShuffleMode, TrainParams};
pub use shuffle::{block_order, split_blocks, TupleShuffler};
pub use trainer::{EpochStats, TrainConfig, TrainError, Trainer};
