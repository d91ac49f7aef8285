//! Table columns → model features: numeric columns (standardized, NULLs imputed), text
//! columns (one-hot over the most frequent categories, or hashed into buckets) and numeric
//! arrays (expanded), mixed freely in one sparse row.
//!
//! Two stages, both streaming:
//! - [`StatsBuilder`] sees every training row once (the statistics pass) and learns means,
//!   standard deviations, array lengths, category counts and the quantiles of numbers encoded
//!   piecewise-linearly, in memory bounded by its dictionary limit;
//! - [`Preprocessor`] (what the statistics give, stored with the model as JSON) encodes a row
//!   into sorted `(index, value)` pairs: the features a linear model sees.
//!
//! The encoded row holds *raw* values (imputed, not yet scaled); [`Preprocessor::standardizer`]
//! gives the scaling that the trainer applies and then folds into the weights, so stored
//! weights stay in the table's units. Numeric slots are present in every row (even at 0),
//! which is what makes centering them on a sparse row exact.
//!
//! Files: `options` (the user's options per column and the plan they resolve to), `statistics`
//! ([`StatsBuilder`]), `merge` (the statistics of a sharded table's shards, merged), `encode` ([`Preprocessor`]: encoding rows, the scaling, feature names),
//! `time` (a date/time column's parts), `quantiles` (a piecewise-linear encoded number's bin
//! edges, its encoding and inverse), `profile` (what a model keeps of its training rows for
//! drift: deciles and category shares).
//! The category buckets hash with [`crate::hash`].

mod encode;
mod merge;
mod options;
pub mod profile;
pub mod quantiles;
mod statistics;
mod time;

use std::collections::HashMap;

pub use encode::{bucket, short, EncodedColumn, EncodedRow, Encoding, OneHotGroup, Preprocessor};
pub use merge::{Category, ColumnPart, MergeError, StatsPart};
pub use options::{
    ColumnOptions, ColumnPlan, Encode, Impute, NullAction, PreprocessOptions, Scale, Source,
    DEFAULT_BUCKETS, EVERY_COLUMN, MAX_BUCKETS,
};
pub use quantiles::{DEFAULT_BINS, MAX_BINS};
pub use statistics::StatsBuilder;
pub use time::{TimeKind, TimePart};

/// Why a row or the statistics cannot be used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PreprocessError {
    /// The category dictionaries outgrew their memory bound.
    #[error(
        "the categories of column \"{column}\" ({distinct} distinct values so far) do not fit in corgipile.max_buffer_memory"
    )]
    TooManyCategories { column: String, distinct: usize },
    #[error(
        "column \"{column}\" has {got} elements, expected {expected} (the length of the first row read)"
    )]
    ArrayLength {
        column: String,
        got: usize,
        expected: usize,
    },
    #[error("column \"{column}\" is NaN or Infinity")]
    NotFinite { column: String },
    /// An array column longer than a model may be wide.
    #[error(
        "column \"{column}\" has {elements} elements, more features than corgipile.max_model_memory allows a model"
    )]
    TooWide { column: String, elements: usize },
    /// Memory for the statistics or the category lookup could not be allocated.
    /// The quantile sketches of piecewise-linear encoded columns alone exceed the bound.
    #[error(
        "the quantile sketches of {columns} columns encoded \"ple\" do not fit in corgipile.max_buffer_memory"
    )]
    TooManySketches { columns: usize },
    #[error("out of memory for the statistics of the feature columns")]
    OutOfMemory,
}

fn not_finite(plan: &ColumnPlan) -> PreprocessError {
    PreprocessError::NotFinite {
        column: plan.name.clone(),
    }
}

/// Category bytes → `V`. Keys are short strings looked up once per row and column while
/// training (see [`MapHasher`](crate::hash::MapHasher); nothing stored depends on a map's
/// order: the kept categories are sorted).
pub type CategoryMap<V> = HashMap<Box<[u8]>, V, crate::hash::MapHasher>;

/// Bytes a distinct category costs besides its text, measured: in the statistics pass's map
/// (boxed key, count, control byte, growth slack), then as a kept category (its name, its
/// lookup entry, its JSON). Counted against the memory settings.
pub const CATEGORY_OVERHEAD: usize = 200;

#[cfg(test)]
mod tests;
