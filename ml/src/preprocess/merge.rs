//! The statistics pass in parts: over a sharded table every shard runs the statistics pass on
//! its own rows and sends what it learned ([`StatsBuilder::part`], a [`StatsPart`]); the
//! coordinator checks each part against its own plans ([`StatsBuilder::check_part`]: a part
//! may come from code the shard's role wrote) and merges them, in a fixed order, into a builder
//! that read no rows ([`StatsBuilder::merge`]), whose [`StatsBuilder::finish`] gives the
//! preprocessing every shard then encodes its rows with.
//!
//! What the merged statistics give, against one pass over every row:
//! - exactly the same: the rows, each category's count (summed), the NULLs of each text
//!   column, the distinct categories (so the kept ones by count, ties by their bytes, the
//!   `max_categories` cut, `(other)` and `(null)`), array lengths, a piecewise-linear column's
//!   extremes and, while it has at most `bins + 1` distinct values, those values (its edges);
//! - the same up to float rounding: means and standard deviations (imputed values, scaling),
//!   Chan's merge of the parts' Welford moments;
//! - estimates, as one pass's are: the bin edges of a piecewise-linear column of more distinct
//!   values, quantiles of the t-digests merged (each part's centroids weighted by the values
//!   its sample stands for, see `QuantileSketch::part`), close to one pass's but not equal.
//!
//! The category dictionaries merged are counted against the same bound as one pass's
//! (`max_dictionary_bytes`, corgipile.max_buffer_memory): a union of the shards' categories
//! that one server could not hold is the same error here.

use serde::{Deserialize, Serialize};

use crate::moments::Welford;

use super::quantiles::SketchPart;
use super::statistics::ColumnStats;
use super::{PreprocessError, StatsBuilder, CATEGORY_OVERHEAD};

/// What one statistics pass learned, as a shard sends it: its rows and each column's part,
/// in the order of the plans.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsPart {
    pub rows: u64,
    pub columns: Vec<ColumnPart>,
}

/// One column's statistics (by the plan's kind).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ColumnPart {
    Number {
        moments: Welford,
    },
    /// A number encoded piecewise-linearly: its moments and its quantile sketch.
    Ple {
        moments: Welford,
        sketch: SketchPart,
    },
    /// A date/time column: its value part's moments.
    Time {
        moments: Welford,
    },
    /// Per element (None: no array seen).
    Array {
        moments: Option<Vec<Welford>>,
    },
    /// A one-hot text column: every category seen with its rows, sorted by its bytes, and the
    /// rows where it was NULL.
    Categories {
        counts: Vec<(Category, u64)>,
        nulls: u64,
    },
    /// A hashed text column learns nothing.
    Hashed,
}

/// A category's bytes: its text (JSON string) when they are UTF-8, else the bytes (a server
/// encoding other than UTF-8), so that two categories never become one on the way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Category {
    Text(String),
    Bytes(Vec<u8>),
}

impl Category {
    pub fn of(bytes: &[u8]) -> Category {
        match std::str::from_utf8(bytes) {
            Ok(t) => Category::Text(t.to_owned()),
            Err(_) => Category::Bytes(bytes.to_vec()),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Category::Text(t) => t.as_bytes(),
            Category::Bytes(b) => b,
        }
    }
}

/// Why a part was not merged.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MergeError {
    /// Statistics no statistics pass over these plans gives (see [`StatsBuilder::check_part`]).
    #[error("{0}")]
    Invalid(String),
    /// Statistics the merge cannot hold, as one pass over the same rows could not: categories
    /// beyond the dictionary bound, arrays beyond the model's width or of another length.
    #[error(transparent)]
    Limit(#[from] PreprocessError),
}

/// More rows than one PostgreSQL table can hold (2^32 pages of at most 291 tuples).
const MAX_ROWS: u64 = 1 << 41;

fn check_moments(m: &Welford, rows: u64) -> Result<(), &'static str> {
    let sound = m.n() <= rows
        && m.mean().is_finite()
        && m.m2().is_finite()
        && m.m2() >= 0.0
        && (m.n() > 0 || (m.mean() == 0.0 && m.m2() == 0.0));
    if sound {
        Ok(())
    } else {
        Err("impossible moments")
    }
}

impl StatsBuilder {
    /// What this pass learned, to send to the coordinator of a sharded training.
    pub fn part(&self) -> Result<StatsPart, PreprocessError> {
        let mut columns = Vec::new();
        columns
            .try_reserve_exact(self.columns.len())
            .map_err(|_| PreprocessError::OutOfMemory)?;
        for c in &self.columns {
            columns.push(match c {
                ColumnStats::Number(m) => ColumnPart::Number { moments: *m },
                ColumnStats::Binned(m, sketch) => ColumnPart::Ple {
                    moments: *m,
                    sketch: sketch.part(),
                },
                ColumnStats::Time(m) => ColumnPart::Time { moments: *m },
                ColumnStats::Array(m) => {
                    let moments = match m {
                        Some(m) => {
                            let mut copy = Vec::new();
                            copy.try_reserve_exact(m.len())
                                .map_err(|_| PreprocessError::OutOfMemory)?;
                            copy.extend_from_slice(m);
                            Some(copy)
                        }
                        None => None,
                    };
                    ColumnPart::Array { moments }
                }
                ColumnStats::Categories(counts, nulls) => {
                    let mut all = Vec::new();
                    all.try_reserve_exact(counts.len())
                        .map_err(|_| PreprocessError::OutOfMemory)?;
                    all.extend(counts.iter().map(|(k, &n)| (Category::of(k), n)));
                    all.sort_unstable_by(|a, b| a.0.bytes().cmp(b.0.bytes()));
                    ColumnPart::Categories {
                        counts: all,
                        nulls: *nulls,
                    }
                }
                ColumnStats::Hashed => ColumnPart::Hashed,
            });
        }
        Ok(StatsPart {
            rows: self.rows,
            columns,
        })
    }

    /// Why `part` (from another server: nothing in it is trusted) is not what a statistics
    /// pass over these plans gives: another number of columns or another kind of column, counts
    /// that do not add up to its rows, a category twice or counted 0 times, moments that are
    /// not finite or of more values than rows, a sketch no sketch is (see
    /// [`SketchPart::check`]), an array longer than a model may be wide. Allocates nothing.
    pub fn check_part(&self, part: &StatsPart) -> Result<(), String> {
        if part.columns.len() != self.plans.len() {
            return Err(format!(
                "statistics of {} feature columns, where the training has {}",
                part.columns.len(),
                self.plans.len()
            ));
        }
        if part.rows > MAX_ROWS {
            return Err(format!("statistics of {} rows", part.rows));
        }
        let rows = part.rows;
        for ((plan, mine), theirs) in self.plans.iter().zip(&self.columns).zip(&part.columns) {
            let bad = |why: &str| format!("statistics of column \"{}\": {why}", plan.name);
            match (mine, theirs) {
                (ColumnStats::Number(_), ColumnPart::Number { moments })
                | (ColumnStats::Time(_), ColumnPart::Time { moments }) => {
                    check_moments(moments, rows).map_err(bad)?
                }
                (ColumnStats::Binned(..), ColumnPart::Ple { moments, sketch }) => {
                    check_moments(moments, rows).map_err(bad)?;
                    if moments.n() != sketch.values {
                        return Err(bad("a sketch of other values than its moments"));
                    }
                    sketch.check(plan.bins).map_err(|why| bad(&why))?;
                }
                (ColumnStats::Array(_), ColumnPart::Array { moments }) => {
                    let Some(moments) = moments else { continue };
                    if moments.len() > self.max_features {
                        return Err(bad(&format!(
                            "arrays of {} elements, more than a model may have features",
                            moments.len()
                        )));
                    }
                    let n = moments.first().map_or(0, Welford::n);
                    for m in moments {
                        check_moments(m, rows).map_err(bad)?;
                        if m.n() != n {
                            return Err(bad("elements counted in other numbers of rows"));
                        }
                    }
                }
                (ColumnStats::Categories(..), ColumnPart::Categories { counts, nulls }) => {
                    if counts.windows(2).any(|p| p[0].0.bytes() >= p[1].0.bytes()) {
                        return Err(bad("categories not sorted, or one twice"));
                    }
                    let mut total = *nulls;
                    for &(_, n) in counts {
                        if n == 0 {
                            return Err(bad("a category of no rows"));
                        }
                        total = total
                            .checked_add(n)
                            .ok_or_else(|| bad("counts beyond 2^64"))?;
                    }
                    if total != rows {
                        return Err(bad(&format!(
                            "categories and NULLs counted in {total} rows of {rows}"
                        )));
                    }
                }
                (ColumnStats::Hashed, ColumnPart::Hashed) => {}
                _ => return Err(bad("statistics of another kind than its plan")),
            }
        }
        Ok(())
    }

    /// Adds another pass's statistics (checked first, [`check_part`](Self::check_part)): what
    /// one pass over both passes' rows would have learned (see the module's notes for what is
    /// exact). Category dictionaries and arrays are bounded as one pass bounds them.
    pub fn merge(&mut self, part: &StatsPart) -> Result<(), MergeError> {
        self.check_part(part).map_err(MergeError::Invalid)?;
        let StatsBuilder {
            plans,
            columns,
            rows,
            dictionary_bytes,
            max_dictionary_bytes,
            max_features,
            width,
            profile_sketches,
        } = self;
        // A part carries no drift deciles: a merged pass's profile counts its numbers in one
        // bin (and their NULLs), rather than in deciles of the rows this pass never saw.
        profile_sketches.iter_mut().for_each(|s| *s = None);
        *rows = rows.saturating_add(part.rows);
        for ((plan, mine), theirs) in plans.iter().zip(columns.iter_mut()).zip(&part.columns) {
            match (mine, theirs) {
                (ColumnStats::Number(m), ColumnPart::Number { moments })
                | (ColumnStats::Time(m), ColumnPart::Time { moments }) => m.merge(moments),
                (ColumnStats::Binned(m, sketch), ColumnPart::Ple { moments, sketch: s }) => {
                    m.merge(moments);
                    sketch.merge(s);
                }
                (
                    ColumnStats::Array(mine),
                    ColumnPart::Array {
                        moments: Some(theirs),
                    },
                ) => match mine {
                    Some(m) if m.len() != theirs.len() => {
                        return Err(PreprocessError::ArrayLength {
                            column: plan.name.clone(),
                            got: theirs.len(),
                            expected: m.len(),
                        }
                        .into())
                    }
                    Some(m) => m.iter_mut().zip(theirs).for_each(|(a, b)| a.merge(b)),
                    None => {
                        let too_wide = PreprocessError::TooWide {
                            column: plan.name.clone(),
                            elements: theirs.len(),
                        };
                        let wider = width.saturating_add(theirs.len());
                        if wider > *max_features {
                            return Err(too_wide.into());
                        }
                        let mut m = Vec::new();
                        m.try_reserve_exact(theirs.len()).map_err(|_| too_wide)?;
                        m.extend_from_slice(theirs);
                        *mine = Some(m);
                        *width = wider;
                    }
                },
                (
                    ColumnStats::Categories(counts, nulls),
                    ColumnPart::Categories {
                        counts: theirs,
                        nulls: their_nulls,
                    },
                ) => {
                    *nulls = nulls.saturating_add(*their_nulls);
                    for (category, n) in theirs {
                        let key = category.bytes();
                        if let Some(c) = counts.get_mut(key) {
                            *c = c.saturating_add(*n);
                            continue;
                        }
                        *dictionary_bytes = dictionary_bytes
                            .saturating_add(key.len())
                            .saturating_add(CATEGORY_OVERHEAD);
                        if *dictionary_bytes > *max_dictionary_bytes {
                            return Err(PreprocessError::TooManyCategories {
                                column: plan.name.clone(),
                                distinct: counts.len(),
                            }
                            .into());
                        }
                        if counts.try_reserve(1).is_err() {
                            return Err(PreprocessError::OutOfMemory.into());
                        }
                        counts.insert(key.into(), *n);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
