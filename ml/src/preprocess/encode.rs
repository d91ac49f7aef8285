//! The preprocessing of a model ([`Preprocessor`], stored with it as JSON): encodes a row's
//! columns into sorted `(index, value)` features, gives the standardizer and feature names;
//! [`bucket`], the hash of a hashed category.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::hash::{fnv1a, fold_mul_fold};
use crate::stats::Standardizer;

use super::options::null_action;
use super::quantiles;
use super::time::{encode_parts, part_feature_name, TimeKind, TimePart};
use super::{Impute, NullAction, PreprocessError, Source, CATEGORY_OVERHEAD};

/// How one column becomes features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "encode", rename_all = "snake_case")]
pub enum Encoding {
    /// One feature; `fill` replaces NULL; `mean`/`std` are the training statistics.
    Number { fill: f64, mean: f64, std: f64 },
    /// A number encoded piecewise-linearly: one feature per bin between consecutive `edges`
    /// (see `quantiles::encode`); `fill` replaces NULL before encoding; `mean`/`std` are the
    /// training statistics of the value.
    Ple {
        fill: f64,
        mean: f64,
        std: f64,
        edges: Vec<f64>,
    },
    /// One feature per element.
    Array {
        fill: Vec<f64>,
        mean: Vec<f64>,
        std: Vec<f64>,
    },
    /// One feature per kept category, then "(other)" if categories were pooled, then "(null)"
    /// if NULL is a category.
    OneHot {
        categories: Vec<String>,
        other: bool,
        null: bool,
    },
    /// One feature per bucket; NULL sets none.
    Hash { buckets: u32 },
    /// A date/time column's parts (see `time`); `fill` replaces a NULL's value part (its
    /// other parts are left out), `mean`/`std` are the value part's training statistics,
    /// `zone` the time zone a `timestamptz` is read in.
    Time {
        kind: TimeKind,
        parts: Vec<TimePart>,
        zone: Option<String>,
        fill: f64,
        mean: f64,
        std: f64,
    },
}

impl Encoding {
    pub fn width(&self) -> usize {
        match self {
            Encoding::Number { .. } => 1,
            Encoding::Ple { edges, .. } => edges.len().saturating_sub(1),
            Encoding::Array { mean, .. } => mean.len(),
            Encoding::OneHot {
                categories,
                other,
                null,
            } => categories.len() + *other as usize + *null as usize,
            Encoding::Hash { buckets } => *buckets as usize,
            Encoding::Time { parts, .. } => parts.iter().map(|p| p.width()).sum(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncodedColumn {
    pub name: String,
    pub source: Source,
    /// Index of the column's first feature.
    pub offset: usize,
    pub impute: Impute,
    /// Standardized while training (numbers only).
    pub scaled: bool,
    #[serde(flatten)]
    pub encoding: Encoding,
}

/// The features of one categorical column (or date/time part), of which a row sets at most
/// one, to 1: what `"inference"` drops a reference level from.
#[derive(Clone, Debug, PartialEq)]
pub struct OneHotGroup {
    /// The column, or `col.dow` / `col.month` for a date/time part.
    pub column: String,
    pub features: std::ops::Range<usize>,
    /// How many of them, from the first, are named levels (then `(other)`, `(null)`).
    pub named: usize,
}

/// The preprocessing of a model: stored with it, applied to every row it trains on, is
/// evaluated on, or predicts.
#[derive(Debug, Serialize, Deserialize)]
pub struct Preprocessor {
    pub columns: Vec<EncodedColumn>,
    pub n_features: usize,
    /// Rows the statistics were computed from.
    pub rows: u64,
    /// What `corgipile_drift` compares today's rows with (see `super::profile`); None for
    /// models trained before it (0.5.0) and preprocessing given rather than learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Box<super::profile::Profile>>,
    /// Category → feature index, per column (one-hot columns only); built on first use.
    #[serde(skip)]
    lookup: OnceLock<Vec<CategoryLookup>>,
}

/// Category → feature index of a one-hot column. Only looked up, never iterated (so no model
/// depends on its order): its seed is random per map, unlike the fixed one of
/// [`super::CategoryMap`], which the results never depend on.
type CategoryLookup = std::collections::HashMap<Box<[u8]>, usize, foldhash::fast::RandomState>;

/// A copy without the category lookup (rebuilt, fallibly, by [`Preprocessor::prepare`]): a
/// model of many categories would otherwise copy large maps with an allocation that cannot fail.
impl Clone for Preprocessor {
    fn clone(&self) -> Self {
        Preprocessor {
            columns: self.columns.clone(),
            n_features: self.n_features,
            rows: self.rows,
            profile: self.profile.clone(),
            lookup: OnceLock::new(),
        }
    }
}

impl PartialEq for Preprocessor {
    fn eq(&self, other: &Self) -> bool {
        self.columns == other.columns && self.n_features == other.n_features
    }
}

/// A row's features, sorted by index (reused between rows).
#[derive(Clone, Debug, Default)]
pub struct EncodedRow {
    pub indices: Vec<u32>,
    pub values: Vec<f64>,
}

impl EncodedRow {
    pub fn clear(&mut self) {
        self.indices.clear();
        self.values.clear();
    }
    #[inline]
    fn push(&mut self, index: usize, value: f64) {
        self.indices.push(index as u32);
        self.values.push(value);
    }
}

impl Preprocessor {
    pub(super) fn new(columns: Vec<EncodedColumn>, rows: u64) -> Preprocessor {
        let n_features = columns.last().map_or(0, |c| c.offset + c.encoding.width());
        Preprocessor {
            columns,
            n_features,
            rows,
            profile: None,
            lookup: OnceLock::new(),
        }
    }

    /// Reads a stored preprocessing; None if it is not one.
    pub fn from_json(v: &Value) -> Option<Preprocessor> {
        let p: Preprocessor = serde_json::from_value(v.clone()).ok()?;
        p.is_sound().then_some(p)
    }

    /// Whether offsets and widths tile [0, n_features) and every column's arrays agree: a
    /// preprocessing read from the catalog or from another server is checked, not trusted
    /// (an encoder would otherwise write features beyond the model).
    pub fn is_sound(&self) -> bool {
        let mut at = 0usize;
        for c in &self.columns {
            let sound = match &c.encoding {
                Encoding::Hash { buckets } => *buckets >= 1,
                Encoding::Ple { edges, .. } => quantiles::sound_edges(edges),
                Encoding::Array { fill, mean, std } => {
                    fill.len() == mean.len() && std.len() == mean.len()
                }
                _ => true,
            };
            if !sound || c.offset != at {
                return false;
            }
            match at.checked_add(c.encoding.width()) {
                Some(next) => at = next,
                None => return false,
            }
        }
        at == self.n_features
    }

    /// The first column whose statistics are not finite numbers (mean, standard deviation,
    /// imputed value): moments merged from other servers' may overflow where each server's
    /// did not. None when every one is finite.
    pub fn not_finite_column(&self) -> Option<&str> {
        let finite = |v: &[&f64]| v.iter().all(|v| v.is_finite());
        self.columns
            .iter()
            .find(|c| match &c.encoding {
                Encoding::Number { fill, mean, std }
                | Encoding::Ple {
                    fill, mean, std, ..
                }
                | Encoding::Time {
                    fill, mean, std, ..
                } => !finite(&[fill, mean, std]),
                Encoding::Array { fill, mean, std } => {
                    !fill.iter().chain(mean).chain(std).all(|v| v.is_finite())
                }
                Encoding::OneHot { .. } | Encoding::Hash { .. } => false,
            })
            .map(|c| c.name.as_str())
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("preprocessing serializes")
    }

    /// Builds the category lookup, fallibly (a model of many categories needs a lot of it):
    /// call before encoding rows. Encoding without it builds it infallibly.
    pub fn prepare(&self) -> Result<(), PreprocessError> {
        if self.lookup.get().is_some() {
            return Ok(());
        }
        let mut maps = Vec::new();
        maps.try_reserve_exact(self.columns.len())
            .map_err(|_| PreprocessError::OutOfMemory)?;
        for c in &self.columns {
            let mut map = CategoryLookup::default();
            if let Encoding::OneHot { categories, .. } = &c.encoding {
                map.try_reserve(categories.len())
                    .map_err(|_| PreprocessError::OutOfMemory)?;
                map.extend(
                    categories
                        .iter()
                        .enumerate()
                        .map(|(i, k)| (k.as_bytes().into(), c.offset + i)),
                );
            }
            maps.push(map);
        }
        let _ = self.lookup.set(maps);
        Ok(())
    }

    fn lookup(&self) -> &[CategoryLookup] {
        if self.lookup.get().is_none() {
            let _ = self.prepare();
        }
        self.lookup.get().map_or(&[], |v| v.as_slice())
    }

    pub fn null_action(&self, col: usize) -> NullAction {
        null_action(self.columns[col].impute)
    }

    /// A numeric column's value (None = NULL, imputed).
    #[inline]
    pub fn number(
        &self,
        col: usize,
        value: Option<f64>,
        out: &mut EncodedRow,
    ) -> Result<(), PreprocessError> {
        let c = &self.columns[col];
        let (Encoding::Number { fill, .. } | Encoding::Ple { fill, .. }) = &c.encoding else {
            unreachable!("column {col} is numeric")
        };
        let v = value.unwrap_or(*fill);
        if !v.is_finite() {
            return Err(PreprocessError::NotFinite {
                column: c.name.clone(),
            });
        }
        match &c.encoding {
            Encoding::Ple { edges, .. } => {
                quantiles::encode(edges, v, |t, e| out.push(c.offset + t, e))
            }
            _ => out.push(c.offset, v),
        }
        Ok(())
    }

    /// A date/time column's value in seconds (None = NULL: the value part imputed, the other
    /// parts left out).
    pub fn time(
        &self,
        col: usize,
        seconds: Option<f64>,
        out: &mut EncodedRow,
    ) -> Result<(), PreprocessError> {
        let c = &self.columns[col];
        let Encoding::Time {
            kind, parts, fill, ..
        } = &c.encoding
        else {
            unreachable!("column {col} is a date/time column")
        };
        let value = seconds.map_or(*fill, |s| kind.value(s));
        if !value.is_finite() {
            return Err(PreprocessError::NotFinite {
                column: c.name.clone(),
            });
        }
        encode_parts(parts, seconds, value, c.offset, |j, v| out.push(j, v));
        Ok(())
    }

    /// Whether an array of `len` elements fits column `col` (checked before conversion).
    pub fn check_array(&self, col: usize, len: usize) -> Result<(), PreprocessError> {
        let expected = self.array_len(col);
        if len == expected {
            Ok(())
        } else {
            Err(PreprocessError::ArrayLength {
                column: self.columns[col].name.clone(),
                got: len,
                expected,
            })
        }
    }

    pub fn array(
        &self,
        col: usize,
        value: Option<&[f64]>,
        out: &mut EncodedRow,
    ) -> Result<(), PreprocessError> {
        let c = &self.columns[col];
        let Encoding::Array { fill, .. } = &c.encoding else {
            unreachable!("column {col} is an array")
        };
        let values = value.unwrap_or(fill);
        if values.len() != fill.len() {
            return Err(PreprocessError::ArrayLength {
                column: c.name.clone(),
                got: values.len(),
                expected: fill.len(),
            });
        }
        if !values.iter().all(|v| v.is_finite()) {
            return Err(PreprocessError::NotFinite {
                column: c.name.clone(),
            });
        }
        for (j, &v) in values.iter().enumerate() {
            out.push(c.offset + j, v);
        }
        Ok(())
    }

    /// A text column's value (None = NULL): its category's feature, "(other)" for a category
    /// not kept in training, nothing when there is no such slot.
    #[inline]
    pub fn text(&self, col: usize, value: Option<&[u8]>, out: &mut EncodedRow) {
        let c = &self.columns[col];
        match &c.encoding {
            Encoding::OneHot {
                categories,
                other,
                null,
            } => {
                let slot = match value {
                    Some(v) => self.lookup()[col]
                        .get(v)
                        .copied()
                        .or(other.then_some(c.offset + categories.len())),
                    None => null.then_some(c.offset + categories.len() + *other as usize),
                };
                if let Some(j) = slot {
                    out.push(j, 1.0);
                }
            }
            Encoding::Hash { buckets } => {
                if let Some(v) = value {
                    out.push(c.offset + bucket(v, *buckets), 1.0);
                }
            }
            _ => unreachable!("column {col} is text"),
        }
    }

    /// The scaling the trainer applies (and folds into the weights at the end): standardized
    /// numbers centered and scaled; categories and unscaled numbers unchanged.
    pub fn standardizer(&self) -> Standardizer {
        let mut mean = vec![0.0; self.n_features];
        let mut scale = vec![1.0; self.n_features];
        for c in self.columns.iter().filter(|c| c.scaled) {
            let mut set = |j: usize, m: f64, s: f64| {
                mean[j] = m;
                scale[j] = if s > 0.0 && s.is_finite() {
                    1.0 / s
                } else {
                    1.0
                };
            };
            match &c.encoding {
                Encoding::Number { mean, std, .. } => set(c.offset, *mean, *std),
                Encoding::Array { mean, std, .. } => {
                    for (k, (m, s)) in mean.iter().zip(std).enumerate() {
                        set(c.offset + k, *m, *s)
                    }
                }
                Encoding::Time {
                    parts, mean, std, ..
                } => {
                    // Only the value part is a number; sin/cos and categories stay as they are.
                    let mut at = c.offset;
                    for part in parts {
                        if *part == TimePart::Value {
                            set(at, *mean, *std);
                        }
                        at += part.width();
                    }
                }
                _ => {}
            }
        }
        Standardizer {
            mean,
            scale,
            center: true,
        }
    }

    /// The scaling a training applies: [`standardizer`](Self::standardizer), not centered when
    /// `center` is false (a model without an intercept, which centering would bring back).
    pub fn scaling(&self, center: bool) -> Standardizer {
        let mut standardizer = self.standardizer();
        if !center {
            standardizer.mean.iter_mut().for_each(|m| *m = 0.0);
            standardizer.center = false;
        }
        standardizer
    }

    /// The column feature `j` belongs to.
    pub fn column_of(&self, j: usize) -> &EncodedColumn {
        let at = self.columns.partition_point(|c| c.offset <= j);
        &self.columns[at.saturating_sub(1)]
    }

    /// Every set of one-hot features of which a row sets at most one: a one-hot text column's
    /// categories (then `(other)`, `(null)`), a date/time column's day of the week and month.
    /// Hashed columns are not among them: a bucket is no level.
    pub fn one_hot_groups(&self) -> Vec<OneHotGroup> {
        let mut groups = Vec::new();
        for c in &self.columns {
            match &c.encoding {
                Encoding::OneHot { categories, .. } => groups.push(OneHotGroup {
                    column: c.name.clone(),
                    features: c.offset..c.offset + c.encoding.width(),
                    named: categories.len(),
                }),
                Encoding::Time { parts, .. } => {
                    let mut at = c.offset;
                    for &part in parts {
                        if matches!(part, TimePart::Dow | TimePart::Month) {
                            groups.push(OneHotGroup {
                                column: format!("{}.{}", c.name, part.name()),
                                features: at..at + part.width(),
                                named: part.width(),
                            });
                        }
                        at += part.width();
                    }
                }
                _ => {}
            }
        }
        groups
    }

    /// The readable name of feature `j`: `col`, `col[3]` (1-based), `col=value`,
    /// `col=(other)`, `col=(null)`, `col#17` (a hash bucket), `col.dow=Mon`, `col.hour_sin`,
    /// `col:[10, 25)` (a bin of a piecewise-linear encoded number, in the table's units; the
    /// last bin is closed, `col:[25, 40]`).
    pub fn feature_name(&self, j: usize) -> String {
        let c = self.column_of(j);
        let k = j - c.offset;
        match &c.encoding {
            Encoding::Number { .. } => c.name.clone(),
            Encoding::Ple { edges, .. } => {
                let close = if k + 2 == edges.len() { ']' } else { ')' };
                format!(
                    "{}:[{}, {}{close}",
                    c.name,
                    short(edges[k]),
                    short(edges[k + 1])
                )
            }
            Encoding::Array { .. } => format!("{}[{}]", c.name, k + 1),
            Encoding::OneHot {
                categories, other, ..
            } => match categories.get(k) {
                Some(v) => format!("{}={}", c.name, v),
                None if *other && k == categories.len() => format!("{}=(other)", c.name),
                None => format!("{}=(null)", c.name),
            },
            Encoding::Hash { .. } => format!("{}#{}", c.name, k),
            Encoding::Time { parts, .. } => part_feature_name(&c.name, parts, k),
        }
    }

    /// The length an array column's rows must have (0 for other columns).
    pub fn array_len(&self, col: usize) -> usize {
        match &self.columns[col].encoding {
            Encoding::Array { fill, .. } => fill.len(),
            _ => 0,
        }
    }

    /// Every column a number, one feature each (in column order): not encoded piecewise-linearly.
    pub fn is_numbers_only(&self) -> bool {
        self.columns
            .iter()
            .all(|c| matches!(c.encoding, Encoding::Number { .. }))
    }

    /// Bytes the kept categories cost besides the weights (names, lookup entries, JSON).
    pub fn category_bytes(&self) -> u64 {
        self.columns
            .iter()
            .map(|c| match &c.encoding {
                Encoding::OneHot { categories, .. } => categories
                    .iter()
                    .map(|k| (k.len() + CATEGORY_OVERHEAD) as u64)
                    .sum(),
                _ => 0,
            })
            .sum()
    }

    /// The time zone a `timestamptz` column `col` is read in (None for other columns).
    pub fn zone(&self, col: usize) -> Option<&str> {
        match &self.columns[col].encoding {
            Encoding::Time { zone, .. } => zone.as_deref(),
            _ => None,
        }
    }

    /// The columns a row must have, by name.
    pub fn column_names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }
}

/// A number as a name shows it: at most 6 significant digits (a bin edge is a quantile
/// estimate; its full digits say nothing).
pub fn short(v: f64) -> String {
    let rounded: f64 = format!("{v:.5e}").parse().unwrap_or(v);
    format!("{rounded}")
}

/// The bucket of a hashed category: FNV-1a over the bytes, finished with a 64-bit mix so the
/// low bits are well spread. Stored models depend on it: never change it.
pub fn bucket(value: &[u8], buckets: u32) -> usize {
    (fold_mul_fold(fnv1a(value.iter().copied())) % buckets as u64) as usize
}
