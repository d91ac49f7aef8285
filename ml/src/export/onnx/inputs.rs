//! The preprocessing of a column-list model's inputs into its features (`double [N,
//! n_features]`), as [`Preprocessor`] encodes a row: each column's features by the stored
//! imputation and encoding, concatenated in the columns' order. Every value is the double
//! corgipile computes (the same operations on the same numbers).

use super::graph::{copy, int, ints, strings, Graph, ML_DOMAIN};
use super::no_prediction;
use crate::export::ExportError;
use crate::preprocess::{EncodedColumn, Encoding, Impute, Preprocessor};

/// The features and which rows have no prediction.
pub struct Features {
    /// `double [N, n_features]`.
    pub x: String,
    /// `bool [N, 1]`: a NULL in a column trained with `"impute": "skip"` or `"error"`.
    pub missing: Option<String>,
}

/// A column's input as its doc string describes it.
pub fn describe(c: &EncodedColumn) -> String {
    let null = match c.impute {
        Impute::Skip => "no prediction (impute skip: NaN outputs)".to_owned(),
        Impute::Error => "no prediction (impute error: NaN outputs)".to_owned(),
        _ => match &c.encoding {
            Encoding::Number { fill, .. } | Encoding::Ple { fill, .. } => {
                format!("imputed with {fill:?}")
            }
            Encoding::Array { .. } => "imputed with the element's stored fill".to_owned(),
            Encoding::OneHot { null: true, .. } => "the category (null)".to_owned(),
            _ => "no feature set".to_owned(),
        },
    };
    match &c.encoding {
        Encoding::OneHot {
            categories, other, ..
        } => format!(
            "column \"{}\": text; {} categories{}; NULL is the empty string{}: {null}",
            c.name,
            categories.len(),
            if *other {
                ", any other value (other)"
            } else {
                ", any other value no feature"
            },
            if categories.iter().any(String::is_empty) {
                " (here a category: NULL cannot be given)"
            } else {
                ""
            },
        ),
        Encoding::Ple { edges, .. } => format!(
            "column \"{}\": number (booleans 0/1) in {} piecewise-linear bins; NaN is NULL: {null}",
            c.name,
            edges.len() - 1
        ),
        Encoding::Array { fill, .. } => format!(
            "column \"{}\": array of {} numbers; a NaN element is NULL: {null}",
            c.name,
            fill.len()
        ),
        _ => format!(
            "column \"{}\": number (booleans 0/1); NaN is NULL: {null}",
            c.name
        ),
    }
}

/// The features of `p`'s columns, read from the inputs `names` (one per column, in order).
pub fn columns(g: &mut Graph, p: &Preprocessor, names: &[String]) -> Result<Features, ExportError> {
    let oom = |_| ExportError::OutOfMemory;
    let mut pieces: Vec<String> = Vec::new();
    let mut missing: Option<String> = None;
    for (c, a) in p.columns.iter().zip(names) {
        let skip = no_prediction(c.impute);
        match &c.encoding {
            Encoding::Number { fill, .. } | Encoding::Ple { fill, .. } => {
                let nan = g.op("IsNaN", &[a], &format!("{}.null", c.name));
                let fill = g.scalar(&format!("{}.fill", c.name), *fill);
                let v = g.select(&nan, &fill, a, &format!("{}.imputed", c.name));
                if skip {
                    missing = Some(g.or(missing, nan));
                }
                match &c.encoding {
                    Encoding::Ple { edges, .. } => pieces.push(ple(g, &c.name, &v, edges)?),
                    _ => pieces.push(v),
                }
            }
            Encoding::Array { fill, .. } => {
                let n = fill.len();
                let nan = g.op("IsNaN", &[a], &format!("{}.null", c.name));
                let fill = g.doubles(
                    &format!("{}.fill", c.name),
                    &[1, n],
                    copy(fill).map_err(oom)?,
                );
                pieces.push(g.select(&nan, &fill, a, &format!("{}.imputed", c.name)));
                if skip {
                    // A NaN anywhere makes the row's sum NaN.
                    let axes = g.int64s("axes", &[1], vec![1]);
                    let sum = g.op_with(
                        "ReduceSum",
                        &[a, &axes],
                        vec![int("keepdims", 1)],
                        &format!("{}.sum", c.name),
                    );
                    let nan = g.op("IsNaN", &[&sum], &format!("{}.null", c.name));
                    missing = Some(g.or(missing, nan));
                }
            }
            Encoding::OneHot {
                categories,
                other,
                null,
            } => {
                let (slots, marker) = one_hot_slots(c, categories, *other, *null);
                let (keys, values): (Vec<Vec<u8>>, Vec<i64>) = slots.into_iter().unzip();
                let default = if *other { categories.len() as i64 } else { -1 };
                let slot = g.name(&format!("{}.slot", c.name));
                let slot = g.node_to(
                    ML_DOMAIN,
                    "LabelEncoder",
                    &[a],
                    vec![
                        strings("keys_strings", keys),
                        ints("values_int64s", values),
                        int("default_int64", default),
                    ],
                    slot,
                );
                let width = c.encoding.width();
                if width > 0 {
                    let range = g.int64s(
                        &format!("{}.slots", c.name),
                        &[1, width],
                        (0..width as i64).collect(),
                    );
                    let hot = g.op("Equal", &[&slot, &range], &format!("{}.hot", c.name));
                    pieces.push(g.flags(&hot, &format!("{}.one_hot", c.name)));
                }
                if let Some(marker) = marker {
                    let marker = g.int64s("null_marker", &[], vec![marker]);
                    let nan = g.op("Equal", &[&slot, &marker], &format!("{}.null", c.name));
                    missing = Some(g.or(missing, nan));
                }
            }
            Encoding::Hash { .. } => {
                return Err(ExportError::HashedOnnx {
                    column: c.name.clone(),
                })
            }
            Encoding::Time { .. } => {
                return Err(ExportError::TimeOnnx {
                    column: c.name.clone(),
                })
            }
        }
    }
    let x = match pieces.len() {
        1 => pieces.pop().unwrap_or_default(),
        _ => {
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            g.op_with("Concat", &refs, vec![int("axis", 1)], "features")
        }
    };
    Ok(Features { x, missing })
}

/// A marker slot: the empty string (NULL) of a column whose NULL is no prediction.
const NULL_MARKER: i64 = -2;

/// The `LabelEncoder` map of a one-hot column: each category to its slot (0-based), and the
/// empty string (NULL) to the `(null)` slot, to no slot (-1) or, where NULL is no prediction,
/// to [`NULL_MARKER`] (returned as the marker to look for) — unless the empty string is a
/// category. Any other text goes to the default: `(other)` or no slot.
fn one_hot_slots(
    c: &EncodedColumn,
    categories: &[String],
    other: bool,
    null: bool,
) -> (Vec<(Vec<u8>, i64)>, Option<i64>) {
    let mut slots: Vec<(Vec<u8>, i64)> = categories
        .iter()
        .enumerate()
        .map(|(i, k)| (k.as_bytes().to_vec(), i as i64))
        .collect();
    let mut marker = None;
    if !categories.iter().any(String::is_empty) {
        let slot = if no_prediction(c.impute) {
            marker = Some(NULL_MARKER);
            NULL_MARKER
        } else if null {
            (categories.len() + other as usize) as i64
        } else {
            -1
        };
        slots.push((Vec::new(), slot));
    }
    (slots, marker)
}

/// The piecewise-linear bins of `v` (`double [N, 1]`) over `edges` (`quantiles::encode`):
/// `(v − lo) / (hi − lo)` per bin, at least 0 but in the first bin, at most 1 but in the last.
fn ple(g: &mut Graph, column: &str, v: &str, edges: &[f64]) -> Result<String, ExportError> {
    let bins = edges.len() - 1;
    let mut lo = Vec::new();
    let mut width = Vec::new();
    let mut below = Vec::new();
    let mut above = Vec::new();
    for v in [&mut lo, &mut width, &mut below, &mut above] {
        v.try_reserve_exact(bins)
            .map_err(|_| ExportError::OutOfMemory)?;
    }
    for t in 0..bins {
        lo.push(edges[t]);
        width.push(edges[t + 1] - edges[t]);
        below.push(if t == 0 { f64::NEG_INFINITY } else { 0.0 });
        above.push(if t + 1 == bins { f64::INFINITY } else { 1.0 });
    }
    let lo = g.doubles(&format!("{column}.bin_low"), &[1, bins], lo);
    let width = g.doubles(&format!("{column}.bin_width"), &[1, bins], width);
    let d = g.op("Sub", &[v, &lo], &format!("{column}.from_low"));
    let fraction = g.op("Div", &[&d, &width], &format!("{column}.fraction"));
    if bins == 1 {
        return Ok(fraction);
    }
    let below = g.doubles(&format!("{column}.bin_floor"), &[1, bins], below);
    let above = g.doubles(&format!("{column}.bin_ceiling"), &[1, bins], above);
    let floored = g.op("Max", &[&fraction, &below], &format!("{column}.floored"));
    Ok(g.op("Min", &[&floored, &above], &format!("{column}.ple")))
}
