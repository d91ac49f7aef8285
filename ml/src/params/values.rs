//! Reading JSON values into parameter values, and the errors that name the key, the
//! offending value and (as the hint) the key's rule from the param table.

use std::collections::BTreeMap;

use serde_json::Value;

use super::options::{ClassWeight, Features, ShuffleMode, StatisticsPass, Validation};
use super::{ParamError, TrainParams, MAX_RATE, PARAMS};
use crate::preprocess::{ColumnOptions, PreprocessOptions};

/// The rule of `key` (what it accepts and its default), "" for an unknown key.
fn rule(key: &str) -> &'static str {
    PARAMS
        .iter()
        .find(|p| p.name == key)
        .map(|p| p.rule)
        .unwrap_or("")
}

pub(super) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The offending value as JSON text, shortened so messages stay readable.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(57).collect::<String>())
    } else {
        s
    }
}

pub(super) fn bad_value(key: &str, v: &Value, problem: &str) -> ParamError {
    ParamError {
        message: format!(
            "invalid value for parameter \"{key}\": {} ({problem})",
            show(v)
        ),
        hint: Some(format!("{key} must be {}", rule(key))),
    }
}

pub(super) fn wrong_type(key: &str, v: &Value, expected: &str) -> ParamError {
    bad_value(
        key,
        v,
        &format!("expected {expected}, got {}", json_type(v)),
    )
}

pub(super) fn unknown_key(key: &str) -> ParamError {
    let lower = key.to_lowercase();
    let suggestion = TrainParams::KEYS
        .iter()
        .map(|k| (edit_distance(&lower, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k);
    let list = format!("valid parameters are: {}", TrainParams::KEYS.join(", "));
    ParamError {
        message: format!("unknown parameter \"{key}\""),
        hint: Some(match suggestion {
            Some(k) => format!("did you mean \"{k}\"? {list}"),
            None => list,
        }),
    }
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

pub(super) fn get_name(key: &str, v: &Value) -> Result<String, ParamError> {
    match v.as_str() {
        Some("") => Err(bad_value(key, v, "empty")),
        Some(s) => Ok(s.to_string()),
        None => Err(wrong_type(key, v, "a string")),
    }
}

const MAX_NAME_CHARS: usize = 200;
/// `"warm_start"`: null, a model id (an integer, or a string that is one, as a text argument
/// naming a model is) or a model name.
pub(super) fn get_model_key(key: &str, v: &Value) -> Result<Option<super::ModelKey>, ParamError> {
    use super::ModelKey;
    match v {
        Value::Null => Ok(None),
        Value::Number(_) => Ok(Some(ModelKey::Id(
            get_int(key, v, 1, i64::MAX as u64)? as i64
        ))),
        Value::String(s) => match s.trim().parse::<i64>() {
            Ok(id) if id >= 1 => Ok(Some(ModelKey::Id(id))),
            Ok(_) => Err(bad_value(key, v, "model ids start at 1")),
            Err(_) => {
                if s.is_empty() || s.chars().count() > MAX_NAME_CHARS {
                    return Err(bad_value(key, v, "a model name has 1 to 200 characters"));
                }
                Ok(Some(ModelKey::Name(s.clone())))
            }
        },
        _ => Err(wrong_type(key, v, "a model id or name")),
    }
}

/// A `"where"` expression longer than this is refused before it is parsed.
const MAX_FILTER_CHARS: usize = 10_000;

/// `"where"`: null or SQL text, checked by the extension's parser (here only its size).
pub(super) fn get_filter(key: &str, v: &Value) -> Result<Option<String>, ParamError> {
    if v.is_null() {
        return Ok(None);
    }
    let text = get_name(key, v)?;
    if text.trim().is_empty() {
        return Err(bad_value(key, v, "empty"));
    }
    if text.chars().count() > MAX_FILTER_CHARS {
        return Err(bad_value(key, v, "longer than 10000 characters"));
    }
    Ok(Some(text))
}

pub(super) fn get_model_name(key: &str, v: &Value) -> Result<Option<String>, ParamError> {
    if v.is_null() {
        return Ok(None);
    }
    let name = get_name(key, v)?;
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(bad_value(key, v, "longer than 200 characters"));
    }
    if name.trim() != name {
        return Err(bad_value(key, v, "leading or trailing white space"));
    }
    // A text argument that is an integer means a model id (corgipile_predict('7', ...)).
    if name.parse::<i64>().is_ok() {
        return Err(bad_value(key, v, "a number: numbers stand for model ids"));
    }
    Ok(Some(name))
}

pub(super) fn get_features(key: &str, v: &Value) -> Result<Features, ParamError> {
    match v {
        Value::String(s) if s == "*" => Ok(Features::All),
        Value::String(_) => Ok(Features::Column(get_name(key, v)?)),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad_value(key, v, "no columns"));
            }
            let mut cols: Vec<String> = Vec::with_capacity(items.len());
            for item in items {
                let name = match item.as_str() {
                    Some(s) if !s.is_empty() => s.to_string(),
                    _ => return Err(bad_value(key, v, "column names must be non-empty strings")),
                };
                if cols.contains(&name) {
                    return Err(bad_value(
                        key,
                        v,
                        &format!("column \"{name}\" is listed twice"),
                    ));
                }
                cols.push(name);
            }
            Ok(Features::Columns(cols))
        }
        Value::Object(o) => {
            if let Some(k) = o.keys().find(|k| *k != "indices" && *k != "values") {
                return Err(bad_value(key, v, &format!("unknown key \"{k}\"")));
            }
            let col = |k: &str| match o.get(k).and_then(Value::as_str) {
                Some(s) if !s.is_empty() => Ok(s.to_string()),
                _ => Err(bad_value(key, v, &format!("\"{k}\" must name a column"))),
            };
            let (indices, values) = (col("indices")?, col("values")?);
            if indices == values {
                return Err(bad_value(
                    key,
                    v,
                    "indices and values must be different columns",
                ));
            }
            Ok(Features::Sparse { indices, values })
        }
        _ => Err(wrong_type(key, v, "a string, an array or an object")),
    }
}

pub(super) fn get_class_weight(key: &str, v: &Value) -> Result<Option<ClassWeight>, ParamError> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s == "balanced" => Ok(Some(ClassWeight::Balanced)),
        Value::String(_) => Err(bad_value(
            key,
            v,
            "the only named weighting is \"balanced\"",
        )),
        Value::Object(o) => {
            if o.is_empty() {
                return Err(bad_value(key, v, "no labels"));
            }
            let mut m = BTreeMap::new();
            for (label, w) in o {
                match w.as_f64() {
                    Some(x) if x.is_finite() && x > 0.0 && x <= MAX_RATE => {
                        m.insert(label.clone(), x);
                    }
                    _ => {
                        return Err(bad_value(
                            key,
                            v,
                            &format!(
                            "the weight of label \"{label}\" must be a number > 0 and <= 1000000"
                        ),
                        ))
                    }
                }
            }
            Ok(Some(ClassWeight::Map(m)))
        }
        _ => Err(wrong_type(key, v, "null, a string or an object")),
    }
}

pub(super) fn get_validation(key: &str, v: &Value) -> Result<Option<Validation>, ParamError> {
    let o = match v {
        Value::Null => return Ok(None),
        Value::Object(o) => o,
        _ => return Err(wrong_type(key, v, "null or an object")),
    };
    let mut it = o.iter();
    let (Some((k, val)), None) = (it.next(), it.next()) else {
        return Err(bad_value(key, v, "expected exactly one key"));
    };
    let text = || match val.as_str() {
        Some(s) if !s.trim().is_empty() => Ok(s.to_string()),
        _ => Err(bad_value(
            key,
            v,
            &format!("\"{k}\" must be a non-empty string"),
        )),
    };
    match k.as_str() {
        "fraction" => match val.as_f64() {
            Some(f) if f > 0.0 && f < 1.0 => Ok(Some(Validation::Fraction(f))),
            _ => Err(bad_value(key, v, "fraction must be a number > 0 and < 1")),
        },
        "relation" => Ok(Some(Validation::Relation(text()?))),
        "predicate" => Ok(Some(Validation::Predicate(text()?))),
        _ => Err(bad_value(
            key,
            v,
            &format!("unknown key \"{k}\"; use fraction, relation or predicate"),
        )),
    }
}

pub(super) fn get_bool(key: &str, v: &Value) -> Result<bool, ParamError> {
    v.as_bool()
        .ok_or_else(|| wrong_type(key, v, "true or false"))
}

/// Integral JSON number, also accepting whole-valued floats like `20.0`
/// (jsonb keeps the `.0`) as long as they are exactly representable.
fn whole_number(n: &serde_json::Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0).then_some(f as i128)
}

pub(super) fn get_int(key: &str, v: &Value, min: u64, max: u64) -> Result<u64, ParamError> {
    let Value::Number(n) = v else {
        return Err(wrong_type(key, v, "an integer"));
    };
    let i = whole_number(n).ok_or_else(|| bad_value(key, v, "not an integer"))?;
    if i < i128::from(min) || i > i128::from(max) {
        return Err(bad_value(key, v, "out of range"));
    }
    Ok(i as u64)
}

pub(super) fn get_float(key: &str, v: &Value, ok: impl Fn(f64) -> bool) -> Result<f64, ParamError> {
    let x = v.as_f64().ok_or_else(|| wrong_type(key, v, "a number"))?;
    // `ok` must also reject NaN; infinities are rejected here.
    if !x.is_finite() || !ok(x) {
        return Err(bad_value(key, v, "out of range"));
    }
    Ok(x)
}

pub(super) fn get_shuffle(key: &str, v: &Value) -> Result<ShuffleMode, ParamError> {
    let s = v.as_str().ok_or_else(|| wrong_type(key, v, "a string"))?;
    ShuffleMode::parse(s).ok_or_else(|| bad_value(key, v, "unknown shuffle mode"))
}

pub(super) fn get_statistics(key: &str, v: &Value) -> Result<StatisticsPass, ParamError> {
    let s = v.as_str().ok_or_else(|| wrong_type(key, v, "a string"))?;
    StatisticsPass::parse(s).ok_or_else(|| bad_value(key, v, "must be \"sample\" or \"exact\""))
}

pub(super) fn get_name_list(key: &str, v: &Value) -> Result<Vec<String>, ParamError> {
    let items = v
        .as_array()
        .ok_or_else(|| wrong_type(key, v, "an array of column names"))?;
    let mut names: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        match item.as_str() {
            Some(s) if !s.is_empty() && !names.iter().any(|n| n == s) => names.push(s.to_owned()),
            Some(s) if !s.is_empty() => {
                return Err(bad_value(
                    key,
                    v,
                    &format!("column \"{s}\" is listed twice"),
                ))
            }
            _ => return Err(bad_value(key, v, "column names must be non-empty strings")),
        }
    }
    Ok(names)
}

pub(super) fn get_preprocess(key: &str, v: &Value) -> Result<PreprocessOptions, ParamError> {
    let obj = v
        .as_object()
        .ok_or_else(|| wrong_type(key, v, "an object keyed by column name"))?;
    let mut out = PreprocessOptions::new();
    for (column, options) in obj {
        let o = ColumnOptions::from_json(options)
            .map_err(|problem| bad_value(key, v, &format!("column \"{column}\": {problem}")))?;
        out.insert(column.clone(), o);
    }
    Ok(out)
}

/// The hidden layers' widths: 1 to 16 integers from 1 to 65536.
pub(super) fn get_hidden(key: &str, v: &Value) -> Result<Option<Vec<u32>>, ParamError> {
    let items = v
        .as_array()
        .ok_or_else(|| wrong_type(key, v, "an array of integers"))?;
    if items.is_empty() || items.len() > 16 {
        return Err(bad_value(key, v, "a network has 1 to 16 hidden layers"));
    }
    items
        .iter()
        .map(|w| get_int(key, w, 1, 1 << 16).map(|w| w as u32))
        .collect::<Result<Vec<u32>, ParamError>>()
        .map(Some)
}

/// The param table of docs/reference.md (header, separator and one row per param, each line
/// ending in a newline), generated from [`PARAMS`](super::PARAMS); a test
/// (ml/tests/reference_params.rs) checks docs/reference.md holds exactly this.
pub fn param_table_markdown() -> String {
    let mut s =
        String::from("| param | default | accepted values | meaning |\n|---|---|---|---|\n");
    for p in PARAMS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            p.name, p.shown_default, p.accepts, p.meaning
        ));
    }
    s
}
