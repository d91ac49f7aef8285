//! Table columns → model features: numeric columns (standardized, NULLs imputed), text
//! columns (one-hot over the most frequent categories, or hashed into buckets) and numeric
//! arrays (expanded), mixed freely in one sparse row.
//!
//! Two stages, both streaming:
//! - [`StatsBuilder`] sees every training row once (the statistics pass) and learns means,
//!   standard deviations, array lengths and category counts, in memory bounded by its
//!   dictionary limit;
//! - [`Preprocessor`] (what the statistics give, stored with the model as JSON) encodes a row
//!   into sorted `(index, value)` pairs: the features a linear model sees.
//!
//! The encoded row holds *raw* values (imputed, not yet scaled); [`Preprocessor::standardizer`]
//! gives the scaling that the trainer applies and then folds into the weights, so stored
//! weights stay in the table's units. Numeric slots are present in every row (even at 0),
//! which is what makes centering them on a sparse row exact.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::hash::{fnv1a, fold_mul_fold, FxHasher};
use crate::moments::Welford;
use crate::stats::Standardizer;

/// What a column holds, as the SQL side reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// int2/int4/int8/float4/float8/numeric/boolean, read as float8.
    Number,
    /// text, varchar, char, name, enums: categories, read as text.
    Text,
    /// A one-dimensional numeric array, one feature per element.
    NumberArray,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encode {
    OneHot,
    Hash,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Impute {
    /// Numbers: the training mean.
    Mean,
    /// Numbers: 0.
    Zero,
    /// Text: NULL is a category of its own.
    Category,
    /// The row is skipped (and counted), as for a NULL label.
    Skip,
    /// The row is an error.
    Error,
}

impl Impute {
    fn name(self) -> &'static str {
        match self {
            Impute::Mean => "mean",
            Impute::Zero => "zero",
            Impute::Category => "category",
            Impute::Skip => "skip",
            Impute::Error => "error",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// (x - mean) / standard deviation while training; folded into the stored weights.
    Standard,
    None,
}

/// What to do with a row whose column is NULL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NullAction {
    Encode,
    Skip,
    Error,
}

/// Default bucket count of a hashed column.
pub const DEFAULT_BUCKETS: u32 = 1024;
/// Most buckets one hashed column may have.
pub const MAX_BUCKETS: u32 = 1 << 24;

/// One column's options as the user wrote them in the `preprocess` param; absent = default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ColumnOptions {
    pub encode: Option<Encode>,
    pub buckets: Option<u32>,
    pub impute: Option<Impute>,
    pub scale: Option<Scale>,
}

impl ColumnOptions {
    /// Reads one column's options; the error text names the problem (the caller names the
    /// parameter and column).
    pub fn from_json(v: &Value) -> Result<ColumnOptions, String> {
        let obj = v
            .as_object()
            .ok_or_else(|| format!("expected an object, got {v}"))?;
        let mut o = ColumnOptions::default();
        for (key, value) in obj {
            let text = || {
                value
                    .as_str()
                    .ok_or_else(|| format!("\"{key}\" must be a string, got {value}"))
            };
            match key.as_str() {
                "encode" => {
                    o.encode = Some(match text()? {
                        "one_hot" => Encode::OneHot,
                        "hash" => Encode::Hash,
                        s => return Err(format!("unknown encode \"{s}\" (one_hot or hash)")),
                    })
                }
                "impute" => {
                    o.impute = Some(match text()? {
                        "mean" => Impute::Mean,
                        "zero" => Impute::Zero,
                        "category" => Impute::Category,
                        "skip" => Impute::Skip,
                        "error" => Impute::Error,
                        s => {
                            return Err(format!(
                                "unknown impute \"{s}\" (mean, zero, category, skip or error)"
                            ))
                        }
                    })
                }
                "scale" => {
                    o.scale = Some(match text()? {
                        "standard" => Scale::Standard,
                        "none" => Scale::None,
                        s => return Err(format!("unknown scale \"{s}\" (standard or none)")),
                    })
                }
                "buckets" => {
                    let n = value
                        .as_u64()
                        .filter(|n| (1..=MAX_BUCKETS as u64).contains(n))
                        .ok_or_else(|| {
                            format!("\"buckets\" must be an integer from 1 to {MAX_BUCKETS}, got {value}")
                        })?;
                    o.buckets = Some(n as u32);
                }
                k => {
                    return Err(format!(
                        "unknown option \"{k}\" (encode, buckets, impute, scale)"
                    ))
                }
            }
        }
        if o.buckets.is_some() && o.encode != Some(Encode::Hash) {
            return Err("\"buckets\" needs \"encode\": \"hash\"".into());
        }
        Ok(o)
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(e) = self.encode {
            m.insert("encode".into(), json!(e));
        }
        if let Some(b) = self.buckets {
            m.insert("buckets".into(), json!(b));
        }
        if let Some(i) = self.impute {
            m.insert("impute".into(), json!(i));
        }
        if let Some(s) = self.scale {
            m.insert("scale".into(), json!(s));
        }
        Value::Object(m)
    }
}

/// The `preprocess` param: options by column name.
pub type PreprocessOptions = BTreeMap<String, ColumnOptions>;

/// A column's resolved plan before the statistics pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnPlan {
    pub name: String,
    pub source: Source,
    pub encode: Encode,
    pub buckets: u32,
    pub impute: Impute,
    pub scale: Scale,
}

impl ColumnPlan {
    /// Resolves the user's options for a column of `source` type. `normalize` is the default
    /// scaling of numbers. The error names the problem (the caller adds the column).
    pub fn resolve(
        name: &str,
        source: Source,
        options: Option<&ColumnOptions>,
        normalize: bool,
    ) -> Result<ColumnPlan, String> {
        let o = options.cloned().unwrap_or_default();
        let numeric = source != Source::Text;
        if numeric && o.encode.is_some() {
            return Err("\"encode\" applies to text columns; this column is numeric".into());
        }
        if !numeric && o.scale.is_some() {
            return Err("\"scale\" applies to numeric columns; this column is text".into());
        }
        let impute = o.impute.unwrap_or(if numeric {
            Impute::Mean
        } else {
            Impute::Category
        });
        match (numeric, impute) {
            (true, Impute::Category) => {
                return Err("\"impute\": \"category\" applies to text columns; numbers take mean, zero, skip or error".into())
            }
            (false, Impute::Mean | Impute::Zero) => {
                return Err(format!("\"impute\": \"{}\" applies to numeric columns; text takes category, skip or error", impute.name()))
            }
            _ => {}
        }
        Ok(ColumnPlan {
            name: name.to_owned(),
            source,
            encode: o.encode.unwrap_or(Encode::OneHot),
            buckets: o.buckets.unwrap_or(DEFAULT_BUCKETS),
            impute,
            scale: o.scale.unwrap_or(if normalize {
                Scale::Standard
            } else {
                Scale::None
            }),
        })
    }

    pub fn null_action(&self) -> NullAction {
        null_action(self.impute)
    }
}

fn null_action(impute: Impute) -> NullAction {
    match impute {
        Impute::Skip => NullAction::Skip,
        Impute::Error => NullAction::Error,
        _ => NullAction::Encode,
    }
}

/// Why a row or the statistics cannot be used.
#[derive(Clone, Debug, PartialEq)]
pub enum PreprocessError {
    /// The category dictionaries outgrew their memory bound.
    TooManyCategories {
        column: String,
        distinct: usize,
    },
    ArrayLength {
        column: String,
        got: usize,
        expected: usize,
    },
    NotFinite {
        column: String,
    },
    /// An array column longer than a model may be wide.
    TooWide {
        column: String,
        elements: usize,
    },
    /// Memory for the statistics or the category lookup could not be allocated.
    OutOfMemory,
}

impl std::fmt::Display for PreprocessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PreprocessError::TooManyCategories { column, distinct } => write!(
                f,
                "the categories of column \"{column}\" ({distinct} distinct values so far) do not fit in corgipile.max_buffer_memory"
            ),
            PreprocessError::ArrayLength {
                column,
                got,
                expected,
            } => write!(
                f,
                "column \"{column}\" has {got} elements, expected {expected} (the length of the first row read)"
            ),
            PreprocessError::NotFinite { column } => {
                write!(f, "column \"{column}\" is NaN or Infinity")
            }
            PreprocessError::OutOfMemory => {
                write!(f, "out of memory for the statistics of the feature columns")
            }
            PreprocessError::TooWide { column, elements } => write!(
                f,
                "column \"{column}\" has {elements} elements, more features than corgipile.max_model_memory allows a model"
            ),
        }
    }
}

/// Category bytes → `V`. Keys are short strings looked up once per row and column while
/// predicting: a multiply-rotate hash (as rustc's FxHash) costs a fraction of SipHash, and
/// flooding is no concern for a map built from the training table by its owner.
pub type CategoryMap<V> = HashMap<Box<[u8]>, V, BuildHasherDefault<FxHasher>>;

/// Bytes a distinct category costs besides its text, measured: in the statistics pass's map
/// (boxed key, count, control byte, growth slack), then as a kept category (its name, its
/// lookup entry, its JSON). Counted against the memory settings.
pub const CATEGORY_OVERHEAD: usize = 200;

#[derive(Clone, Debug)]
enum ColumnStats {
    Number(Welford),
    Array(Option<Vec<Welford>>),
    Categories(CategoryMap<u64>, u64),
    Hashed,
}

/// The statistics pass: feed every training row's columns (after the NULL policy decided the
/// row is kept), then [`StatsBuilder::finish`].
#[derive(Clone, Debug)]
pub struct StatsBuilder {
    plans: Vec<ColumnPlan>,
    columns: Vec<ColumnStats>,
    rows: u64,
    dictionary_bytes: usize,
    max_dictionary_bytes: usize,
    /// Most features the model may have: numbers, hash buckets and array elements together
    /// are checked against it before an array's per-element statistics are allocated.
    max_features: usize,
    /// Features known so far: one per number, the buckets of hashed columns, the elements of
    /// the arrays seen.
    width: usize,
}

impl StatsBuilder {
    /// `max_dictionary_bytes` bounds the category dictionaries; `max_features` the model's
    /// width (see [`StatsBuilder::fixed_width`]).
    pub fn new(
        plans: Vec<ColumnPlan>,
        max_dictionary_bytes: usize,
        max_features: usize,
    ) -> StatsBuilder {
        let width = ColumnPlan::fixed_width(&plans);
        let columns = plans
            .iter()
            .map(|p| match (p.source, p.encode) {
                (Source::Number, _) => ColumnStats::Number(Welford::default()),
                (Source::NumberArray, _) => ColumnStats::Array(None),
                (Source::Text, Encode::OneHot) => {
                    ColumnStats::Categories(CategoryMap::default(), 0)
                }
                (Source::Text, Encode::Hash) => ColumnStats::Hashed,
            })
            .collect();
        StatsBuilder {
            plans,
            columns,
            rows: 0,
            dictionary_bytes: 0,
            max_dictionary_bytes,
            max_features,
            width,
        }
    }

    pub fn plans(&self) -> &[ColumnPlan] {
        &self.plans
    }

    /// Counts a row; call once per kept row, before its columns.
    pub fn begin_row(&mut self) {
        self.rows += 1;
    }

    pub fn number(&mut self, col: usize, value: Option<f64>) -> Result<(), PreprocessError> {
        if let (ColumnStats::Number(m), Some(v)) = (&mut self.columns[col], value) {
            if !v.is_finite() {
                return Err(not_finite(&self.plans[col]));
            }
            m.push(v);
        }
        Ok(())
    }

    /// Whether an array of `len` elements may be fed to column `col` (its length so far, and
    /// the model's width): checked before the caller converts the elements.
    pub fn check_array(&self, col: usize, len: usize) -> Result<(), PreprocessError> {
        let column = || self.plans[col].name.clone();
        match &self.columns[col] {
            ColumnStats::Array(Some(m)) if m.len() != len => Err(PreprocessError::ArrayLength {
                column: column(),
                got: len,
                expected: m.len(),
            }),
            ColumnStats::Array(None) if self.width.saturating_add(len) > self.max_features => {
                Err(PreprocessError::TooWide {
                    column: column(),
                    elements: len,
                })
            }
            _ => Ok(()),
        }
    }

    pub fn array(&mut self, col: usize, value: Option<&[f64]>) -> Result<(), PreprocessError> {
        let (ColumnStats::Array(moments), Some(values)) = (&mut self.columns[col], value) else {
            return Ok(());
        };
        if moments.is_none() {
            let width = self.width.saturating_add(values.len());
            let too_wide = PreprocessError::TooWide {
                column: self.plans[col].name.clone(),
                elements: values.len(),
            };
            if width > self.max_features {
                return Err(too_wide);
            }
            let mut m = Vec::new();
            m.try_reserve_exact(values.len()).map_err(|_| too_wide)?;
            m.resize(values.len(), Welford::default());
            *moments = Some(m);
            self.width = width;
        }
        let m = moments.as_mut().expect("set above");
        if m.len() != values.len() {
            return Err(PreprocessError::ArrayLength {
                column: self.plans[col].name.clone(),
                got: values.len(),
                expected: m.len(),
            });
        }
        if !values.iter().all(|v| v.is_finite()) {
            return Err(not_finite(&self.plans[col]));
        }
        for (m, &v) in m.iter_mut().zip(values) {
            m.push(v);
        }
        Ok(())
    }

    pub fn text(&mut self, col: usize, value: Option<&[u8]>) -> Result<(), PreprocessError> {
        let ColumnStats::Categories(counts, nulls) = &mut self.columns[col] else {
            return Ok(());
        };
        let Some(v) = value else {
            *nulls += 1;
            return Ok(());
        };
        if let Some(c) = counts.get_mut(v) {
            *c += 1;
            return Ok(());
        }
        self.dictionary_bytes += v.len() + CATEGORY_OVERHEAD;
        if self.dictionary_bytes > self.max_dictionary_bytes {
            return Err(PreprocessError::TooManyCategories {
                column: self.plans[col].name.clone(),
                distinct: counts.len(),
            });
        }
        // Growth is fallible: the dictionary's bound is a setting, the server's memory may be
        // less (an allocation failure in Rust would abort the backend).
        if counts.try_reserve(1).is_err() {
            return Err(PreprocessError::OutOfMemory);
        }
        counts.insert(v.into(), 1);
        Ok(())
    }

    /// The preprocessing the statistics give: the most frequent `max_categories` categories
    /// of each one-hot column (ties by value), the rest pooled into "(other)".
    pub fn finish(self, max_categories: usize) -> Result<Preprocessor, PreprocessError> {
        let mut offset = 0usize;
        let mut columns = Vec::with_capacity(self.plans.len());
        for (plan, stats) in self.plans.into_iter().zip(self.columns) {
            let encoding = match stats {
                ColumnStats::Number(m) => {
                    let (mean, std) = m.mean_std();
                    Encoding::Number {
                        fill: if plan.impute == Impute::Zero {
                            0.0
                        } else {
                            mean
                        },
                        mean,
                        std,
                    }
                }
                ColumnStats::Array(m) => {
                    let m = m.unwrap_or_default();
                    let (mean, std): (Vec<f64>, Vec<f64>) = m.iter().map(Welford::mean_std).unzip();
                    Encoding::Array {
                        fill: if plan.impute == Impute::Zero {
                            vec![0.0; mean.len()]
                        } else {
                            mean.clone()
                        },
                        mean,
                        std,
                    }
                }
                ColumnStats::Categories(counts, nulls) => {
                    let distinct = counts.len();
                    let mut all: Vec<(Box<[u8]>, u64)> = Vec::new();
                    all.try_reserve_exact(counts.len())
                        .map_err(|_| PreprocessError::OutOfMemory)?;
                    all.extend(counts);
                    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                    all.truncate(max_categories);
                    Encoding::OneHot {
                        categories: all
                            .into_iter()
                            .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
                            .collect(),
                        other: distinct > max_categories,
                        null: nulls > 0 && plan.impute == Impute::Category,
                    }
                }
                ColumnStats::Hashed => Encoding::Hash {
                    buckets: plan.buckets,
                },
            };
            let width = encoding.width();
            columns.push(EncodedColumn {
                name: plan.name,
                source: plan.source,
                offset,
                impute: plan.impute,
                scaled: plan.scale == Scale::Standard && plan.source != Source::Text,
                encoding,
            });
            offset += width;
        }
        let p = Preprocessor::new(columns, self.rows);
        p.prepare()?;
        Ok(p)
    }
}

/// (source, encode, buckets) of each column, for [`fixed_width`].
fn plans_width(plans: &[ColumnPlan]) -> Vec<(Source, Encode, u32)> {
    plans
        .iter()
        .map(|p| (p.source, p.encode, p.buckets))
        .collect()
}

/// The features a list of columns has whatever the data: one per number column, the buckets
/// of each hashed column (checked against the model limit before any row is read).
pub fn fixed_width(columns: &[(Source, Encode, u32)]) -> usize {
    columns
        .iter()
        .map(|&(source, encode, buckets)| match (source, encode) {
            (Source::Number, _) => 1,
            (Source::Text, Encode::Hash) => buckets as usize,
            _ => 0,
        })
        .sum()
}

impl ColumnPlan {
    /// The features the plans have whatever the data (see [`fixed_width`]).
    pub fn fixed_width(plans: &[ColumnPlan]) -> usize {
        fixed_width(&plans_width(plans))
    }
}

fn not_finite(plan: &ColumnPlan) -> PreprocessError {
    PreprocessError::NotFinite {
        column: plan.name.clone(),
    }
}

/// How one column becomes features.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "encode", rename_all = "snake_case")]
pub enum Encoding {
    /// One feature; `fill` replaces NULL; `mean`/`std` are the training statistics.
    Number { fill: f64, mean: f64, std: f64 },
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
}

impl Encoding {
    fn width(&self) -> usize {
        match self {
            Encoding::Number { .. } => 1,
            Encoding::Array { mean, .. } => mean.len(),
            Encoding::OneHot {
                categories,
                other,
                null,
            } => categories.len() + *other as usize + *null as usize,
            Encoding::Hash { buckets } => *buckets as usize,
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

/// The preprocessing of a model: stored with it, applied to every row it trains on, is
/// evaluated on, or predicts.
#[derive(Debug, Serialize, Deserialize)]
pub struct Preprocessor {
    pub columns: Vec<EncodedColumn>,
    pub n_features: usize,
    /// Rows the statistics were computed from.
    pub rows: u64,
    /// Category → feature index, per column (one-hot columns only); built on first use.
    #[serde(skip)]
    lookup: OnceLock<Vec<CategoryMap<usize>>>,
}

/// A copy without the category lookup (rebuilt, fallibly, by [`Preprocessor::prepare`]): a
/// model of many categories would otherwise copy large maps with an allocation that cannot fail.
impl Clone for Preprocessor {
    fn clone(&self) -> Self {
        Preprocessor {
            columns: self.columns.clone(),
            n_features: self.n_features,
            rows: self.rows,
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
    fn new(columns: Vec<EncodedColumn>, rows: u64) -> Preprocessor {
        let n_features = columns.last().map_or(0, |c| c.offset + c.encoding.width());
        Preprocessor {
            columns,
            n_features,
            rows,
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
            let mut map = CategoryMap::default();
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

    fn lookup(&self) -> &[CategoryMap<usize>] {
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
        let Encoding::Number { fill, .. } = c.encoding else {
            unreachable!("column {col} is numeric")
        };
        let v = value.unwrap_or(fill);
        if !v.is_finite() {
            return Err(PreprocessError::NotFinite {
                column: c.name.clone(),
            });
        }
        out.push(c.offset, v);
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
                _ => {}
            }
        }
        Standardizer {
            mean,
            scale,
            center: true,
        }
    }

    /// The readable name of feature `j`: `col`, `col[3]` (1-based), `col=value`,
    /// `col=(other)`, `col=(null)`, `col#17` (a hash bucket).
    pub fn feature_name(&self, j: usize) -> String {
        let at = self.columns.partition_point(|c| c.offset <= j);
        let c = &self.columns[at.saturating_sub(1)];
        let k = j - c.offset;
        match &c.encoding {
            Encoding::Number { .. } => c.name.clone(),
            Encoding::Array { .. } => format!("{}[{}]", c.name, k + 1),
            Encoding::OneHot {
                categories, other, ..
            } => match categories.get(k) {
                Some(v) => format!("{}={}", c.name, v),
                None if *other && k == categories.len() => format!("{}=(other)", c.name),
                None => format!("{}=(null)", c.name),
            },
            Encoding::Hash { .. } => format!("{}#{}", c.name, k),
        }
    }

    /// The length an array column's rows must have (0 for other columns).
    pub fn array_len(&self, col: usize) -> usize {
        match &self.columns[col].encoding {
            Encoding::Array { fill, .. } => fill.len(),
            _ => 0,
        }
    }

    /// Every column a number (one feature each, in column order).
    pub fn is_numbers_only(&self) -> bool {
        self.columns.iter().all(|c| c.source == Source::Number)
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

    /// The columns a row must have, by name.
    pub fn column_names(&self) -> impl Iterator<Item = &str> {
        self.columns.iter().map(|c| c.name.as_str())
    }
}

/// The bucket of a hashed category: FNV-1a over the bytes, finished with a 64-bit mix so the
/// low bits are well spread. Stored models depend on it: never change it.
pub fn bucket(value: &[u8], buckets: u32) -> usize {
    (fold_mul_fold(fnv1a(value.iter().copied())) % buckets as u64) as usize
}

#[cfg(test)]
mod tests;
