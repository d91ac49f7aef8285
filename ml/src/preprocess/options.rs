//! What the user asks of each column ([`ColumnOptions`], the `preprocess` param) and the plan
//! it resolves to before the statistics pass ([`ColumnPlan`]): source, encoding, buckets,
//! imputation, scaling.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::quantiles::{DEFAULT_BINS, MAX_BINS};
use super::time::{TimeKind, TimePart};

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
    /// A date, timestamp, time or interval, read as seconds (see `time`): its parts.
    Time(TimeKind),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encode {
    /// Text: one feature per kept category.
    OneHot,
    /// Text: hashed into buckets.
    Hash,
    /// Numbers: piecewise-linear over quantile bins (see `quantiles`).
    Ple,
    /// Numbers: the value itself.
    #[serde(rename = "none")]
    Plain,
}

impl Encode {
    fn name(self) -> &'static str {
        match self {
            Encode::OneHot => "one_hot",
            Encode::Hash => "hash",
            Encode::Ple => "ple",
            Encode::Plain => "none",
        }
    }

    /// Whether it encodes numbers (else text).
    fn of_numbers(self) -> bool {
        matches!(self, Encode::Ple | Encode::Plain)
    }
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
    /// `"encode": "ple"`: how many bins.
    pub bins: Option<u32>,
    pub impute: Option<Impute>,
    pub scale: Option<Scale>,
    /// Date/time columns: the parts that become features.
    pub parts: Option<Vec<TimePart>>,
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
                        "ple" => Encode::Ple,
                        "none" => Encode::Plain,
                        s => {
                            return Err(format!(
                            "unknown encode \"{s}\" (text: one_hot or hash; numbers: ple or none)"
                        ))
                        }
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
                "parts" => {
                    let list = value.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
                        format!("\"parts\" must be a non-empty array of \"value\", \"hour\", \"dow\", \"month\", got {value}")
                    })?;
                    let mut parts = Vec::new();
                    for item in list {
                        let part = item.as_str().and_then(TimePart::parse).ok_or_else(|| {
                            format!("unknown part {item} (value, hour, dow or month)")
                        })?;
                        if parts.contains(&part) {
                            return Err(format!("part \"{}\" is listed twice", part.name()));
                        }
                        parts.push(part);
                    }
                    o.parts = Some(parts);
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
                "bins" => {
                    let n = value
                        .as_u64()
                        .filter(|n| (2..=MAX_BINS as u64).contains(n))
                        .ok_or_else(|| {
                            format!("\"bins\" must be an integer from 2 to {MAX_BINS}, got {value}")
                        })?;
                    o.bins = Some(n as u32);
                }
                k => {
                    return Err(format!(
                        "unknown option \"{k}\" (encode, buckets, bins, impute, scale, parts)"
                    ))
                }
            }
        }
        if o.buckets.is_some() && o.encode != Some(Encode::Hash) {
            return Err("\"buckets\" needs \"encode\": \"hash\"".into());
        }
        if o.bins.is_some() && o.encode != Some(Encode::Ple) {
            return Err("\"bins\" needs \"encode\": \"ple\"".into());
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
        if let Some(b) = self.bins {
            m.insert("bins".into(), json!(b));
        }
        if let Some(i) = self.impute {
            m.insert("impute".into(), json!(i));
        }
        if let Some(s) = self.scale {
            m.insert("scale".into(), json!(s));
        }
        if let Some(p) = &self.parts {
            m.insert("parts".into(), json!(p));
        }
        Value::Object(m)
    }
}

/// The `preprocess` param: options by column name.
pub type PreprocessOptions = BTreeMap<String, ColumnOptions>;

fn default_bins() -> u32 {
    DEFAULT_BINS
}

/// A column's resolved plan before the statistics pass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnPlan {
    pub name: String,
    pub source: Source,
    pub encode: Encode,
    pub buckets: u32,
    /// `Encode::Ple`: the most bins (fewer when quantiles coincide).
    #[serde(default = "default_bins")]
    pub bins: u32,
    pub impute: Impute,
    pub scale: Scale,
    /// Date/time columns: the parts that become features, in order.
    #[serde(default)]
    pub parts: Vec<TimePart>,
    /// `timestamptz` columns: the time zone whose wall clock they are read on (the session's
    /// at training; stored, so that prediction reads them alike).
    #[serde(default)]
    pub zone: Option<String>,
}

/// The key of `preprocess` whose options apply to every column that does not set them.
pub const EVERY_COLUMN: &str = "*";

impl ColumnOptions {
    /// The options of a column of `source` type: its own, and for each option it does not set,
    /// the `"*"` default's where that option applies to the column's type (`"encode": "ple"`
    /// to numbers, `"hash"` to text, `"scale"` to numbers, dates and arrays, ...): a default
    /// never makes a column an error.
    pub fn with_default(
        own: Option<&ColumnOptions>,
        every: Option<&ColumnOptions>,
        source: Source,
    ) -> ColumnOptions {
        let mut o = own.cloned().unwrap_or_default();
        let Some(d) = every else { return o };
        let numeric = source != Source::Text;
        if o.encode.is_none() {
            if let Some(e) = d.encode.filter(|e| match source {
                Source::Number => e.of_numbers(),
                Source::Text => !e.of_numbers(),
                _ => false,
            }) {
                o.encode = Some(e);
                o.buckets = d.buckets;
                o.bins = d.bins;
            }
        }
        if o.impute.is_none() {
            o.impute = d.impute.filter(|i| match i {
                Impute::Mean | Impute::Zero => numeric,
                Impute::Category => !numeric,
                Impute::Skip | Impute::Error => true,
            });
        }
        if o.scale.is_none() && numeric && o.encode != Some(Encode::Ple) {
            o.scale = d.scale;
        }
        if o.parts.is_none() {
            if let (Source::Time(kind), Some(parts)) = (source, &d.parts) {
                if parts.iter().all(|p| kind.has(*p)) {
                    o.parts = Some(parts.clone());
                }
            }
        }
        o
    }
}

impl ColumnPlan {
    /// Resolves the user's options for a column of `source` type (its own merged with the
    /// `"*"` default: [`ColumnOptions::with_default`]). `normalize` is the default scaling of
    /// numbers (a kind that encodes numbers otherwise by default says so in the `"*"`
    /// default). The error names the problem (the caller adds the column).
    pub fn resolve(
        name: &str,
        source: Source,
        options: Option<&ColumnOptions>,
        normalize: bool,
    ) -> Result<ColumnPlan, String> {
        let o = options.cloned().unwrap_or_default();
        let numeric = source != Source::Text;
        let parts = match (source, &o.parts) {
            (Source::Time(kind), parts) => {
                let parts = parts.clone().unwrap_or_else(|| kind.default_parts());
                if let Some(p) = parts.iter().find(|p| !kind.has(**p)) {
                    return Err(format!(
                        "\"parts\": {} has no \"{}\"",
                        kind.name(),
                        p.name()
                    ));
                }
                parts
            }
            (_, Some(_)) => {
                return Err(
                    "\"parts\" applies to date, timestamp, time and interval columns".into(),
                )
            }
            (_, None) => Vec::new(),
        };
        let encode = match (source, o.encode) {
            (Source::Text, None) => Encode::OneHot,
            (_, None) => Encode::Plain,
            (Source::Text, Some(e)) if !e.of_numbers() => e,
            (Source::Number, Some(e)) if e.of_numbers() => e,
            (Source::Text, Some(e)) => {
                return Err(format!("\"encode\": \"{}\" applies to number and boolean columns; text takes one_hot or hash", e.name()))
            }
            (Source::Number, Some(e)) => {
                return Err(format!("\"encode\": \"{}\" applies to text columns; numbers take ple or none", e.name()))
            }
            (_, Some(_)) => {
                return Err("\"encode\" applies to text, number and boolean columns, not to arrays or dates and times".into())
            }
        };
        if !numeric && o.scale.is_some() {
            return Err("\"scale\" applies to numeric columns; this column is text".into());
        }
        if encode == Encode::Ple && o.scale.is_some() {
            return Err("\"scale\" does not apply to a column encoded \"ple\" (its features are already between 0 and 1)".into());
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
            encode,
            buckets: o.buckets.unwrap_or(DEFAULT_BUCKETS),
            bins: o.bins.unwrap_or(DEFAULT_BINS),
            impute,
            scale: if encode == Encode::Ple {
                Scale::None
            } else {
                o.scale.unwrap_or(if normalize {
                    Scale::Standard
                } else {
                    Scale::None
                })
            },
            parts,
            zone: None,
        })
    }

    /// Whether the column's statistics are a category dictionary (one-hot text).
    pub fn keeps_categories(&self) -> bool {
        self.source == Source::Text && self.encode == Encode::OneHot
    }

    pub fn null_action(&self) -> NullAction {
        null_action(self.impute)
    }
}

pub(super) fn null_action(impute: Impute) -> NullAction {
    match impute {
        Impute::Skip => NullAction::Skip,
        Impute::Error => NullAction::Error,
        _ => NullAction::Encode,
    }
}

impl ColumnPlan {
    /// The features the plans have whatever the data: one per number column, the buckets of
    /// each hashed column, a date/time column's parts (checked against the model limit before
    /// any row is read).
    pub fn fixed_width(plans: &[ColumnPlan]) -> usize {
        plans
            .iter()
            .map(|p| match (p.source, p.encode) {
                (Source::Number, Encode::Ple) => p.bins as usize,
                (Source::Number, _) => 1,
                (Source::Text, Encode::Hash) => p.buckets as usize,
                (Source::Time(_), _) => p.parts.iter().map(|t| t.width()).sum(),
                _ => 0,
            })
            .sum()
    }
}
