//! The statistics pass ([`StatsBuilder`]): every kept training row once; learns the means and
//! standard deviations of numbers and array elements, array lengths and category counts, in
//! memory bounded by the dictionary limit; gives the [`Preprocessor`]. (A sharded training's
//! shards each send theirs as a part, merged by the coordinator: `merge`.)

use crate::moments::Welford;

use super::profile::{ColumnProfile, NumberSketch, Profile, Summary, NUMBER_SKETCH_BYTES};
use super::quantiles::{QuantileSketch, SKETCH_BYTES};

use super::{
    not_finite, CategoryMap, ColumnPlan, Encode, EncodedColumn, Encoding, Impute, PreprocessError,
    Preprocessor, Scale, Source, CATEGORY_OVERHEAD,
};

#[derive(Clone, Debug)]
pub(super) enum ColumnStats {
    Number(Welford),
    /// A piecewise-linear encoded number: its moments (its imputed value, the explanation's
    /// baseline) and a sketch of its values (its bin edges).
    Binned(Welford, Box<QuantileSketch>),
    /// A date/time column: the moments of its value part.
    Time(Welford),
    Array(Option<Vec<Welford>>),
    Categories(CategoryMap<u64>, u64),
    Hashed,
}

/// The statistics pass: feed every training row's columns (after the NULL policy decided the
/// row is kept), then [`StatsBuilder::finish`].
#[derive(Clone, Debug)]
pub struct StatsBuilder {
    pub(super) plans: Vec<ColumnPlan>,
    pub(super) columns: Vec<ColumnStats>,
    pub(super) rows: u64,
    pub(super) dictionary_bytes: usize,
    pub(super) max_dictionary_bytes: usize,
    /// Most features the model may have: numbers, hash buckets and array elements together
    /// are checked against it before an array's per-element statistics are allocated.
    pub(super) max_features: usize,
    /// Features known so far: one per number, the buckets of hashed columns, the elements of
    /// the arrays seen.
    pub(super) width: usize,
    /// The drift profile's deciles of each number column (see [`StatsBuilder::profile`]);
    /// empty when they would take more than a quarter of the dictionary bound.
    pub(super) profile_sketches: Vec<Option<NumberSketch>>,
}

impl StatsBuilder {
    /// `max_dictionary_bytes` bounds the category dictionaries and quantile sketches (which
    /// are counted first: an error if they alone do not fit); `max_features` the model's
    /// width (see [`ColumnPlan::fixed_width`]).
    pub fn new(
        plans: Vec<ColumnPlan>,
        max_dictionary_bytes: usize,
        max_features: usize,
    ) -> Result<StatsBuilder, PreprocessError> {
        let width = ColumnPlan::fixed_width(&plans);
        let sketches = plans
            .iter()
            .filter(|p| p.source == Source::Number && p.encode == Encode::Ple)
            .count();
        let dictionary_bytes = sketches.saturating_mul(SKETCH_BYTES);
        if dictionary_bytes > max_dictionary_bytes {
            return Err(PreprocessError::TooManySketches { columns: sketches });
        }
        // The drift profile's sketches: kept only when they take at most a quarter of the
        // bound (a model of very many number columns is profiled without deciles).
        let numbers = plans.iter().filter(|p| p.source == Source::Number).count();
        let profile_bytes = numbers.saturating_mul(NUMBER_SKETCH_BYTES);
        let profile_sketches = if profile_bytes <= max_dictionary_bytes / 4
            && dictionary_bytes + profile_bytes <= max_dictionary_bytes
        {
            plans
                .iter()
                .map(|p| (p.source == Source::Number).then(NumberSketch::new))
                .collect()
        } else {
            Vec::new()
        };
        let dictionary_bytes = dictionary_bytes
            + if profile_sketches.is_empty() {
                0
            } else {
                profile_bytes
            };
        let columns = plans
            .iter()
            .map(|p| match (p.source, p.encode) {
                (Source::Number, Encode::Ple) => {
                    ColumnStats::Binned(Welford::default(), Box::new(QuantileSketch::new(p.bins)))
                }
                (Source::Number, _) => ColumnStats::Number(Welford::default()),
                (Source::NumberArray, _) => ColumnStats::Array(None),
                (Source::Time(_), _) => ColumnStats::Time(Welford::default()),
                (Source::Text, Encode::OneHot) => {
                    ColumnStats::Categories(CategoryMap::default(), 0)
                }
                (Source::Text, _) => ColumnStats::Hashed,
            })
            .collect();
        Ok(StatsBuilder {
            plans,
            columns,
            rows: 0,
            dictionary_bytes,
            max_dictionary_bytes,
            max_features,
            width,
            profile_sketches,
        })
    }

    pub fn plans(&self) -> &[ColumnPlan] {
        &self.plans
    }

    /// Counts a row; call once per kept row, before its columns.
    pub fn begin_row(&mut self) {
        self.rows += 1;
    }

    pub fn number(&mut self, col: usize, value: Option<f64>) -> Result<(), PreprocessError> {
        let Some(v) = value else { return Ok(()) };
        if !v.is_finite() {
            return Err(not_finite(&self.plans[col]));
        }
        if let Some(Some(sketch)) = self.profile_sketches.get_mut(col) {
            sketch.push(v);
        }
        match &mut self.columns[col] {
            ColumnStats::Number(m) => m.push(v),
            ColumnStats::Binned(m, sketch) => {
                m.push(v);
                sketch.push(v);
            }
            _ => {}
        }
        Ok(())
    }

    /// A date/time column's value in seconds (see `time`).
    pub fn time(&mut self, col: usize, seconds: Option<f64>) -> Result<(), PreprocessError> {
        if let (ColumnStats::Time(m), Some(s), Source::Time(kind)) =
            (&mut self.columns[col], seconds, self.plans[col].source)
        {
            if !s.is_finite() {
                return Err(not_finite(&self.plans[col]));
            }
            m.push(kind.value(s));
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

    /// The drift profile of the rows seen (their sketches taken: call once, before
    /// [`finish`](Self::finish)): each number's rows, NULLs, moments and deciles, each one-hot
    /// column's shares of the categories `finish(max_categories)` keeps, "(other)" and NULL,
    /// rows and NULLs of the others (arrays are profiled by their stored means and scales).
    pub fn profile(&mut self, max_categories: usize) -> Result<Profile, PreprocessError> {
        let rows = self.rows;
        let mut sketches = std::mem::take(&mut self.profile_sketches);
        let mut columns = Vec::with_capacity(self.plans.len());
        for (i, (plan, stats)) in self.plans.iter().zip(&self.columns).enumerate() {
            let summary = match stats {
                ColumnStats::Number(m) | ColumnStats::Binned(m, _) => {
                    let (mean, std) = m.mean_std();
                    let (cuts, shares, min, max) = match sketches.get_mut(i).and_then(Option::take)
                    {
                        Some(s) => s.finish(),
                        None => (Vec::new(), vec![1.0], 0.0, 0.0),
                    };
                    Summary::Number {
                        rows,
                        missing: rows - m.n(),
                        mean,
                        std,
                        min,
                        max,
                        cuts,
                        shares,
                    }
                }
                ColumnStats::Categories(counts, nulls) => {
                    // The kept categories, as `finish` picks them (by count, ties by value).
                    let mut all: Vec<(&[u8], u64)> = Vec::new();
                    all.try_reserve_exact(counts.len())
                        .map_err(|_| PreprocessError::OutOfMemory)?;
                    all.extend(counts.iter().map(|(k, &c)| (&k[..], c)));
                    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
                    // At most PROFILE_CATEGORIES of them (the most frequent; the rest are
                    // "(other)" here): the profile is stored with every model, and a column of
                    // 65,536 kept categories would double the preprocessing's size.
                    let kept = max_categories.min(super::profile::PROFILE_CATEGORIES);
                    let other: u64 = all.iter().skip(kept).map(|a| a.1).sum();
                    all.truncate(kept);
                    let mut n: Vec<u64> = all.iter().map(|a| a.1).collect();
                    n.extend([other, *nulls]);
                    Summary::Categories {
                        rows,
                        missing: *nulls,
                        categories: all
                            .iter()
                            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                            .collect(),
                        shares: super::profile::shares(&n),
                    }
                }
                ColumnStats::Time(m) => Summary::Count {
                    rows,
                    missing: rows - m.n(),
                },
                ColumnStats::Array(_) | ColumnStats::Hashed => Summary::Count { rows, missing: 0 },
            };
            columns.push(ColumnProfile {
                name: plan.name.clone(),
                summary,
            });
        }
        Ok(Profile {
            rows,
            columns,
            label: None,
            predictions: None,
        })
    }

    /// The preprocessing the statistics give: the most frequent `max_categories` categories
    /// of each one-hot column (ties by value), the rest pooled into "(other)".
    pub fn finish(self, max_categories: usize) -> Result<Preprocessor, PreprocessError> {
        let mut offset = 0usize;
        let mut columns = Vec::with_capacity(self.plans.len());
        for (plan, stats) in self.plans.into_iter().zip(self.columns) {
            // What replaces a NULL number: 0 or the training mean.
            let zero = plan.impute == Impute::Zero;
            let fill = |mean: f64| if zero { 0.0 } else { mean };
            let encoding = match stats {
                ColumnStats::Number(m) => {
                    let (mean, std) = m.mean_std();
                    Encoding::Number {
                        fill: fill(mean),
                        mean,
                        std,
                    }
                }
                ColumnStats::Binned(m, sketch) => {
                    let (mean, std) = m.mean_std();
                    Encoding::Ple {
                        fill: fill(mean),
                        mean,
                        std,
                        edges: sketch.edges(),
                    }
                }
                ColumnStats::Time(m) => {
                    let (mean, std) = m.mean_std();
                    let Source::Time(kind) = plan.source else {
                        unreachable!("time statistics belong to a time column")
                    };
                    Encoding::Time {
                        kind,
                        parts: plan.parts.clone(),
                        zone: plan.zone.clone(),
                        fill: fill(mean),
                        mean,
                        std,
                    }
                }
                ColumnStats::Array(m) => {
                    let m = m.unwrap_or_default();
                    let (mean, std): (Vec<f64>, Vec<f64>) = m.iter().map(Welford::mean_std).unzip();
                    Encoding::Array {
                        fill: mean.iter().map(|&m| fill(m)).collect(),
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
                scaled: plan.scale == Scale::Standard
                    && plan.source != Source::Text
                    && plan.encode != Encode::Ple,
                encoding,
            });
            offset += width;
        }
        let p = Preprocessor::new(columns, self.rows);
        p.prepare()?;
        Ok(p)
    }
}
