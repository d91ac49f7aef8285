//! Per-prediction explanations (`corgipile_explain_predict`): how much each input column moved
//! one output of a model (a decision value, a class's score, a regression's prediction) away
//! from its value at a **baseline** row, the training means and most frequent categories.
//!
//! - [`attribute`]: the share of each encoded feature. Linear models: exactly
//!   `w_j·(x_j - x0_j)` (the weights are stored in the table's units, so this is the weight on
//!   the standardized feature times the standardized value's distance from the baseline's);
//!   networks: integrated gradients from the same baseline
//!   ([`Network::integrated_gradients`](crate::network::Network::integrated_gradients)),
//!   which is the same formula for a linear function. The shares add up to
//!   `value - baseline`.
//! - [`baseline`]: the baseline row of a column list's preprocessing.
//! - [`by_column`] / [`by_feature`]: the shares summed per input column (a one-hot or hashed
//!   column, an array column, a date's parts are one entry each), or one entry per feature
//!   (models trained on arrays), each with the value the model read; [`rank`] sorts them by
//!   magnitude and keeps the top k, the rest summed into one entry.

use crate::model::Predictor;
use crate::preprocess::{quantiles, Encoding, Preprocessor, TimePart};
use crate::row::Row;
use crate::trained::Model;

/// Why an explanation cannot be computed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ExplainError {
    #[error("out of memory for the explanation")]
    OutOfMemory,
}

/// One output's value at a row and at the baseline, and each feature's share of the difference.
#[derive(Clone, Debug)]
pub struct Attribution {
    pub value: f64,
    pub baseline: f64,
    pub per_feature: Vec<f64>,
    /// `value - baseline - Σ per_feature`: rounding for linear models and ReLU networks, the
    /// quadrature's error for tanh networks (see `network::attribution`).
    pub residual: f64,
}

fn zeros(n: usize) -> Result<Vec<f64>, ExplainError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| ExplainError::OutOfMemory)?;
    v.resize(n, 0.0);
    Ok(v)
}

/// A row as a dense vector of `n` features (sparse indices at or beyond `n` are left out, as
/// the models ignore them).
pub fn densify(row: Row, n: usize) -> Result<Vec<f64>, ExplainError> {
    let mut x = zeros(n)?;
    match row {
        Row::Dense(v) => x.iter_mut().zip(v).for_each(|(x, v)| *x = *v),
        Row::Sparse { indices, values } => {
            for (&j, &v) in indices.iter().zip(values) {
                if let Some(slot) = x.get_mut(j as usize) {
                    *slot = v;
                }
            }
        }
    }
    Ok(x)
}

/// Each feature's share of output `output` at `x` against the baseline `x0` (both dense, the
/// model's width; `output` below its outputs).
pub fn attribute(
    model: &Model,
    x: &[f64],
    x0: &[f64],
    output: usize,
) -> Result<Attribution, ExplainError> {
    let mut scores = Vec::new();
    model.scores(Row::Dense(x), &mut scores);
    let value = scores[output];
    model.scores(Row::Dense(x0), &mut scores);
    let baseline = scores[output];
    let per_feature = model
        .attribute(x, x0, output)
        .map_err(|_| ExplainError::OutOfMemory)?;
    let residual = value - baseline - per_feature.iter().sum::<f64>();
    Ok(Attribution {
        value,
        baseline,
        per_feature,
        residual,
    })
}

/// The baseline row of a column list: numbers and array elements at their training means (a
/// piecewise-linear encoded number: its mean encoded);
/// a one-hot column at its most frequent category (of the values that were not NULL; a
/// column that was NULL in every row: its `(null)` slot); a date/time column's value part at
/// its mean, its other parts left out (as a NULL's); a hashed column sets no bucket (as a
/// NULL: the buckets' frequencies are not stored).
pub fn baseline(p: &Preprocessor) -> Result<Vec<f64>, ExplainError> {
    let mut x0 = zeros(p.n_features)?;
    for c in &p.columns {
        let at = c.offset;
        match &c.encoding {
            Encoding::Number { mean, .. } => x0[at] = *mean,
            Encoding::Ple { mean, edges, .. } => {
                quantiles::encode(edges, *mean, |t, e| x0[at + t] = e)
            }
            Encoding::Array { mean, .. } => x0[at..at + mean.len()].copy_from_slice(mean),
            Encoding::OneHot {
                categories,
                other,
                null,
            } => {
                if !categories.is_empty() {
                    x0[at] = 1.0;
                } else if *null {
                    x0[at + *other as usize] = 1.0;
                }
            }
            Encoding::Hash { .. } => {}
            Encoding::Time { parts, mean, .. } => {
                let mut j = at;
                for part in parts {
                    if *part == TimePart::Value {
                        x0[j] = *mean;
                    }
                    j += part.width();
                }
            }
        }
    }
    Ok(x0)
}

/// One entry of an explanation: a column (or feature), the value the model read, its share.
#[derive(Clone, Debug, PartialEq)]
pub struct Contribution {
    pub name: String,
    pub value: String,
    pub contribution: f64,
}

/// Elements of an array shown in an entry's value.
const SHOWN_ELEMENTS: usize = 8;

fn number(v: f64) -> String {
    format!("{v}")
}

/// What column `c` of `p` read in the dense encoded row `x`.
fn describe(p: &Preprocessor, c: usize, x: &[f64]) -> String {
    let col = &p.columns[c];
    let at = col.offset;
    let width = col.encoding.width();
    let set = || (0..width).find(|&k| x[at + k] != 0.0);
    match &col.encoding {
        Encoding::Number { .. } => number(x[at]),
        // The value the bins encode, to 12 significant digits (decoding adds a last-digit error).
        Encoding::Ple { edges, .. } => {
            let v = quantiles::decode(edges, &x[at..at + width]);
            number(format!("{v:.11e}").parse().unwrap_or(v))
        }
        Encoding::Array { .. } => {
            let shown: Vec<String> = x[at..at + width]
                .iter()
                .take(SHOWN_ELEMENTS)
                .map(|&v| number(v))
                .collect();
            let more = if width > SHOWN_ELEMENTS { ",…" } else { "" };
            format!("{{{}{more}}}", shown.join(","))
        }
        Encoding::OneHot {
            categories, other, ..
        } => match set() {
            Some(k) => match categories.get(k) {
                Some(v) => v.clone(),
                None if *other && k == categories.len() => "(other)".into(),
                None => "(null)".into(),
            },
            None => "(no category)".into(),
        },
        Encoding::Hash { .. } => set().map_or("(null)".into(), |k| format!("#{k}")),
        Encoding::Time { parts, .. } => {
            let mut shown = Vec::new();
            let mut j = at;
            for part in parts {
                match part {
                    TimePart::Value => shown.push(number(x[j])),
                    TimePart::Hour if x[j] != 0.0 || x[j + 1] != 0.0 => {
                        let turn = x[j].atan2(x[j + 1]).rem_euclid(std::f64::consts::TAU);
                        shown.push(format!("hour={:.2}", turn / std::f64::consts::TAU * 24.0));
                    }
                    TimePart::Dow | TimePart::Month => {
                        if let Some(k) = (0..part.width()).find(|&k| x[j + k] != 0.0) {
                            let name = p.feature_name(j + k);
                            let part = name.strip_prefix(&format!("{}.", col.name));
                            shown.push(part.unwrap_or(&name).to_owned());
                        }
                    }
                    TimePart::Hour => {}
                }
                j += part.width();
            }
            shown.join(" ")
        }
    }
}

fn entries(n: usize) -> Result<Vec<Contribution>, ExplainError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| ExplainError::OutOfMemory)?;
    Ok(v)
}

/// The shares of a column list's model summed per column, in column order, each with the value
/// the model read (after imputation: a NULL number shows its fill).
pub fn by_column(
    p: &Preprocessor,
    x: &[f64],
    per_feature: &[f64],
) -> Result<Vec<Contribution>, ExplainError> {
    let mut out = entries(p.columns.len())?;
    for (c, col) in p.columns.iter().enumerate() {
        let width = col.encoding.width();
        out.push(Contribution {
            name: col.name.clone(),
            value: describe(p, c, x),
            contribution: per_feature[col.offset..col.offset + width].iter().sum(),
        });
    }
    Ok(out)
}

/// One entry per feature (a model trained on arrays), named by `name`.
pub fn by_feature(
    x: &[f64],
    per_feature: &[f64],
    name: impl Fn(usize) -> String,
) -> Result<Vec<Contribution>, ExplainError> {
    let mut out = entries(per_feature.len())?;
    for (j, (&v, &c)) in x.iter().zip(per_feature).enumerate() {
        out.push(Contribution {
            name: name(j),
            value: number(v),
            contribution: c,
        });
    }
    Ok(out)
}

/// The name of the entry that sums what [`rank`] leaves out.
pub const REST: &str = "(the rest)";

/// Sorts entries by the magnitude of their share, largest first (ties: in their order), and
/// keeps the first `top`, the others summed into one last entry named [`REST`] (its value:
/// how many it sums), so that the shares still add up.
pub fn rank(v: &mut Vec<Contribution>, top: Option<usize>) {
    v.sort_by(|a, b| b.contribution.abs().total_cmp(&a.contribution.abs()));
    if let Some(top) = top.filter(|&t| t < v.len()) {
        let rest: f64 = v[top..].iter().map(|c| c.contribution).sum();
        let n = v.len() - top;
        v.truncate(top);
        v.push(Contribution {
            name: REST.into(),
            value: format!("{n} more"),
            contribution: rest,
        });
    }
}

#[cfg(test)]
mod tests;
