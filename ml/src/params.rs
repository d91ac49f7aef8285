//! Training parameters: parsed from the user's JSON object, validated, and
//! written back (defaults filled in) for storage with the model.
//!
//! Every key has exactly one name, a default and a range. Unknown keys are
//! errors (with a "did you mean" suggestion), so a typo never silently falls
//! back to a default.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::arena::{TupleArena, MAX_FEATURES};
use crate::model::ModelKind;
use crate::stats::balanced_class_weights;
use crate::trainer::{LrSchedule, TrainConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShuffleMode {
    /// Shuffle block order and the tuples inside each buffer.
    Corgipile,
    /// Shuffle block order only; tuples of a buffer are visited in storage order.
    BlockOnly,
    /// Sequential scan, no shuffling at all.
    NoShuffle,
    /// Sequential scan through a TensorFlow-style shuffle buffer (window).
    SlidingWindow,
    /// Sequential scan through Bismarck's multiplexed reservoir sampling.
    Mrs,
}

impl ShuffleMode {
    pub const ALL: [ShuffleMode; 5] = [
        ShuffleMode::Corgipile,
        ShuffleMode::BlockOnly,
        ShuffleMode::NoShuffle,
        ShuffleMode::SlidingWindow,
        ShuffleMode::Mrs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ShuffleMode::Corgipile => "corgipile",
            ShuffleMode::BlockOnly => "block_only",
            ShuffleMode::NoShuffle => "no_shuffle",
            ShuffleMode::SlidingWindow => "sliding_window",
            ShuffleMode::Mrs => "mrs",
        }
    }

    pub fn parse(name: &str) -> Option<ShuffleMode> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether the block visiting order is shuffled.
    pub fn shuffles_blocks(self) -> bool {
        matches!(self, ShuffleMode::Corgipile | ShuffleMode::BlockOnly)
    }

    /// Whether each buffer's tuples are shuffled.
    pub fn shuffles_tuples(self) -> bool {
        self == ShuffleMode::Corgipile
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum BlockSize {
    /// See [`resolve_block_pages`].
    Auto,
    Pages(u32),
    Bytes(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum BufferSize {
    /// Fraction of the table's on-disk size, in (0, 1].
    Fraction(f64),
    Bytes(u64),
    Tuples(u64),
}

/// Where the features come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Features {
    /// One array column (JSON: a string).
    Column(String),
    /// Several numeric columns, one feature each (JSON: an array of names).
    Columns(Vec<String>),
    /// Sparse rows from an index array column and a value array column
    /// (JSON: {"indices": "col", "values": "col"}).
    Sparse { indices: String, values: String },
}

impl Features {
    pub fn is_sparse(&self) -> bool {
        matches!(self, Features::Sparse { .. })
    }
}

/// Learning-rate schedule by name; `decay` parameterizes the exponential one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    Constant,
    Exponential,
    InverseSqrt,
}

impl ScheduleKind {
    pub const ALL: [ScheduleKind; 3] = [
        ScheduleKind::Constant,
        ScheduleKind::Exponential,
        ScheduleKind::InverseSqrt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::Constant => "constant",
            ScheduleKind::Exponential => "exponential",
            ScheduleKind::InverseSqrt => "inverse_sqrt",
        }
    }

    pub fn parse(name: &str) -> Option<ScheduleKind> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn schedule(self, decay: f64) -> LrSchedule {
        match self {
            ScheduleKind::Constant => LrSchedule::Constant,
            ScheduleKind::Exponential => LrSchedule::Exponential { decay },
            ScheduleKind::InverseSqrt => LrSchedule::InverseSqrt,
        }
    }
}

/// Per-class weights on loss and gradient.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ClassWeight {
    /// n / (K · n_c), as scikit-learn's "balanced".
    Balanced,
    /// Label (as text) → weight > 0; unlisted labels weigh 1.
    Map(BTreeMap<String, f64>),
}

impl ClassWeight {
    /// Weights by class index, for classes whose labels (as text) are
    /// `labels` (binary: [negative, positive]; softmax: in class-index order)
    /// and whose row counts are `counts`. A map naming a label that does not
    /// occur is an error.
    pub fn resolve(&self, labels: &[String], counts: &[u64]) -> Result<Vec<f64>, ParamError> {
        match self {
            ClassWeight::Balanced => Ok(balanced_class_weights(counts)),
            ClassWeight::Map(m) => {
                if let Some(k) = m.keys().find(|k| !labels.contains(k)) {
                    return Err(ParamError {
                        message: format!(
                            "class_weight names label \"{k}\", which does not occur in the label column"
                        ),
                        hint: Some(format!(
                            "the labels are: {}",
                            labels.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
                        )),
                    });
                }
                Ok(labels
                    .iter()
                    .map(|l| m.get(l).copied().unwrap_or(1.0))
                    .collect())
            }
        }
    }
}

/// Held-out rows for validation. JSON: {"fraction": 0.2} (a hash-selected
/// fraction of the table), {"relation": "t"} or {"predicate": "id % 5 = 0"}.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Validation {
    Fraction(f64),
    Relation(String),
    Predicate(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainParams {
    pub features: Features,
    pub label: String,
    pub epochs: u32,
    pub learning_rate: f64,
    pub learning_rate_schedule: ScheduleKind,
    pub decay: f64,
    pub l2: f64,
    pub l1: f64,
    pub batch_size: u32,
    pub fit_intercept: bool,
    pub normalize: bool,
    pub class_weight: Option<ClassWeight>,
    /// Sparse features only: the dimension (None: inferred from the indices).
    pub n_features: Option<u32>,
    /// Sparse features only: index of the first feature, 0 or 1.
    pub index_base: u8,
    pub validation: Option<Validation>,
    pub tolerance: f64,
    pub seed: Option<u64>,
    pub shuffle: ShuffleMode,
    pub block_size: BlockSize,
    /// True iff block_size differs from the default ("auto").
    pub block_size_explicit: bool,
    pub buffer_size: BufferSize,
    /// True iff buffer_size differs from the default ("10%"). An explicit size
    /// that exceeds the memory limit is an error; the default is clamped.
    pub buffer_size_explicit: bool,
    pub double_buffer: bool,
    pub verbose: bool,
    /// The model's name: each training of a name stores a new version of it.
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ParamError {
    pub message: String,
    pub hint: Option<String>,
}

impl std::fmt::Display for ParamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

const MAX_EPOCHS: u64 = 1_000_000;
const MAX_BATCH: u64 = 1_000_000;
const MAX_RATE: f64 = 1e6;
const MAX_BLOCK_PAGES: u64 = 1 << 31;
const MAX_SEED: u64 = i64::MAX as u64; // fits a PostgreSQL bigint
const DEFAULT_BUFFER: BufferSize = BufferSize::Fraction(0.10);

/// (key, what it accepts + default): the hint shown for a bad value.
const RULES: &[(&str, &str)] = &[
    (
        "features",
        "a non-empty string naming one array column (default \"features\"), an array of distinct column names, or {\"indices\": column, \"values\": column} for sparse rows",
    ),
    ("label", "a non-empty string naming the label column (default \"label\")"),
    ("epochs", "an integer from 1 to 1000000 (default 20)"),
    ("learning_rate", "a number > 0 and <= 1000000 (default 0.01)"),
    (
        "learning_rate_schedule",
        "one of \"constant\", \"exponential\" (learning_rate·decay^(epoch-1)), \"inverse_sqrt\" (learning_rate/sqrt(epoch)) (default \"exponential\")",
    ),
    ("decay", "a number > 0 and <= 1, the learning-rate multiplier per epoch (default 0.95)"),
    ("l2", "a number >= 0 and <= 1000000 (default 0)"),
    ("l1", "a number >= 0 and <= 1000000 (default 0)"),
    ("batch_size", "an integer from 1 to 1000000 (default 1)"),
    ("fit_intercept", "true or false: learn a bias term (default true)"),
    ("normalize", "true or false: standardize the features (default false)"),
    (
        "class_weight",
        "null, \"balanced\", or an object mapping label values to weights > 0 such as {\"1\": 5} (default null)",
    ),
    (
        "n_features",
        "null (inferred from the indices) or an integer from 1 to 2147483647 (default null)",
    ),
    ("index_base", "0 or 1, the index of the first sparse feature (default 1)"),
    (
        "validation",
        "null, {\"fraction\": f} with 0 < f < 1, {\"relation\": name} or {\"predicate\": sql} (default null)",
    ),
    ("tolerance", "a number >= 0; 0 turns early stopping off (default 0)"),
    ("seed", "an integer from 0 to 9223372036854775807, or null for a random seed (default null)"),
    ("shuffle", "one of \"corgipile\", \"block_only\", \"no_shuffle\", \"sliding_window\", \"mrs\" (default \"corgipile\")"),
    (
        "block_size",
        "\"auto\", a size such as \"10MB\", or a number of pages from 1 to 2147483648 (default \"auto\")",
    ),
    (
        "buffer_size",
        "a percentage of the table such as \"10%\" (above 0% and at most 100%), a size such as \"64MB\", or a number of tuples >= 1 (default \"10%\")",
    ),
    ("double_buffer", "true or false (default true)"),
    ("verbose", "true or false: report progress once per epoch (default true)"),
    (
        "name",
        "null or a string of 1 to 200 characters, not an integer, naming the model; each training of a name stores a new version (default null)",
    ),
];

impl Default for TrainParams {
    fn default() -> Self {
        Self::defaults()
    }
}

impl TrainParams {
    /// All valid keys, in documentation order.
    pub const KEYS: &'static [&'static str] = &[
        "features",
        "label",
        "epochs",
        "learning_rate",
        "learning_rate_schedule",
        "decay",
        "l2",
        "l1",
        "batch_size",
        "fit_intercept",
        "normalize",
        "class_weight",
        "n_features",
        "index_base",
        "validation",
        "tolerance",
        "seed",
        "shuffle",
        "block_size",
        "buffer_size",
        "double_buffer",
        "verbose",
        "name",
    ];

    pub fn defaults() -> Self {
        TrainParams {
            features: Features::Column("features".to_string()),
            label: "label".to_string(),
            epochs: 20,
            learning_rate: 0.01,
            learning_rate_schedule: ScheduleKind::Exponential,
            decay: 0.95,
            l2: 0.0,
            l1: 0.0,
            batch_size: 1,
            fit_intercept: true,
            normalize: false,
            class_weight: None,
            n_features: None,
            index_base: 1,
            validation: None,
            tolerance: 0.0,
            seed: None,
            shuffle: ShuffleMode::Corgipile,
            block_size: BlockSize::Auto,
            block_size_explicit: false,
            buffer_size: DEFAULT_BUFFER,
            buffer_size_explicit: false,
            double_buffer: true,
            verbose: true,
            name: None,
        }
    }

    /// Parses and validates a JSON object of parameters; absent keys take
    /// their defaults. A block_size/buffer_size equal to its default counts as
    /// not explicit (this keeps `from_json(&p.to_json()) == p`).
    pub fn from_json(value: &Value) -> Result<TrainParams, ParamError> {
        let obj = value.as_object().ok_or_else(|| ParamError {
            message: format!("params must be a JSON object, got {}", json_type(value)),
            hint: Some("pass e.g. '{\"epochs\": 10, \"learning_rate\": 0.05}'::jsonb".to_string()),
        })?;
        // Report typos before any value error: they explain the most.
        if let Some(key) = obj.keys().find(|k| !Self::KEYS.contains(&k.as_str())) {
            return Err(unknown_key(key));
        }

        let mut p = Self::defaults();
        for (key, v) in obj {
            match key.as_str() {
                "features" => p.features = get_features(key, v)?,
                "label" => p.label = get_name(key, v)?,
                "epochs" => p.epochs = get_int(key, v, 1, MAX_EPOCHS)? as u32,
                "learning_rate" => {
                    p.learning_rate = get_float(key, v, |x| x > 0.0 && x <= MAX_RATE)?
                }
                "learning_rate_schedule" => {
                    let s = v.as_str().ok_or_else(|| wrong_type(key, v, "a string"))?;
                    p.learning_rate_schedule = ScheduleKind::parse(s)
                        .ok_or_else(|| bad_value(key, v, "unknown schedule"))?;
                }
                "decay" => p.decay = get_float(key, v, |x| x > 0.0 && x <= 1.0)?,
                "l2" => p.l2 = get_float(key, v, |x| (0.0..=MAX_RATE).contains(&x))?,
                "l1" => p.l1 = get_float(key, v, |x| (0.0..=MAX_RATE).contains(&x))?,
                "batch_size" => p.batch_size = get_int(key, v, 1, MAX_BATCH)? as u32,
                "fit_intercept" => p.fit_intercept = get_bool(key, v)?,
                "normalize" => p.normalize = get_bool(key, v)?,
                "class_weight" => p.class_weight = get_class_weight(key, v)?,
                "n_features" => {
                    p.n_features = if v.is_null() {
                        None
                    } else {
                        Some(get_int(key, v, 1, MAX_FEATURES as u64)? as u32)
                    }
                }
                "index_base" => p.index_base = get_int(key, v, 0, 1)? as u8,
                "validation" => p.validation = get_validation(key, v)?,
                "tolerance" => p.tolerance = get_float(key, v, |x| x >= 0.0)?,
                "seed" => {
                    p.seed = if v.is_null() {
                        None
                    } else {
                        Some(get_int(key, v, 0, MAX_SEED)?)
                    }
                }
                "shuffle" => p.shuffle = get_shuffle(key, v)?,
                "block_size" => {
                    p.block_size = get_block_size(key, v)?;
                    p.block_size_explicit = p.block_size != BlockSize::Auto;
                }
                "buffer_size" => {
                    p.buffer_size = get_buffer_size(key, v)?;
                    p.buffer_size_explicit = p.buffer_size != DEFAULT_BUFFER;
                }
                "double_buffer" => p.double_buffer = get_bool(key, v)?,
                "verbose" => p.verbose = get_bool(key, v)?,
                "name" => p.name = get_model_name(key, v)?,
                _ => unreachable!("unknown keys were rejected above"),
            }
        }
        Ok(p)
    }

    /// The effective parameters as a JSON object with every key.
    pub fn to_json(&self) -> Value {
        let block_size = match self.block_size {
            BlockSize::Auto => json!("auto"),
            BlockSize::Pages(p) => json!(p),
            BlockSize::Bytes(b) => json!(format_bytes_exact(b)),
        };
        let buffer_size = match self.buffer_size {
            BufferSize::Fraction(f) => json!(format_percent(f)),
            BufferSize::Bytes(b) => json!(format_bytes_exact(b)),
            BufferSize::Tuples(t) => json!(t),
        };
        let mut m = Map::new();
        let features = match &self.features {
            Features::Column(c) => json!(c),
            Features::Columns(cs) => json!(cs),
            Features::Sparse { indices, values } => json!({"indices": indices, "values": values}),
        };
        let class_weight = match &self.class_weight {
            None => Value::Null,
            Some(ClassWeight::Balanced) => json!("balanced"),
            Some(ClassWeight::Map(m)) => json!(m),
        };
        let validation = match &self.validation {
            None => Value::Null,
            Some(Validation::Fraction(f)) => json!({ "fraction": f }),
            Some(Validation::Relation(r)) => json!({ "relation": r }),
            Some(Validation::Predicate(p)) => json!({ "predicate": p }),
        };
        m.insert("features".into(), features);
        m.insert("label".into(), json!(self.label));
        m.insert("epochs".into(), json!(self.epochs));
        m.insert("learning_rate".into(), json!(self.learning_rate));
        m.insert(
            "learning_rate_schedule".into(),
            json!(self.learning_rate_schedule.name()),
        );
        m.insert("decay".into(), json!(self.decay));
        m.insert("l2".into(), json!(self.l2));
        m.insert("l1".into(), json!(self.l1));
        m.insert("batch_size".into(), json!(self.batch_size));
        m.insert("fit_intercept".into(), json!(self.fit_intercept));
        m.insert("normalize".into(), json!(self.normalize));
        m.insert("class_weight".into(), class_weight);
        m.insert("n_features".into(), json!(self.n_features));
        m.insert("index_base".into(), json!(self.index_base));
        m.insert("validation".into(), validation);
        m.insert("tolerance".into(), json!(self.tolerance));
        m.insert("seed".into(), json!(self.seed));
        m.insert("shuffle".into(), json!(self.shuffle.name()));
        m.insert("block_size".into(), block_size);
        m.insert("buffer_size".into(), buffer_size);
        m.insert("double_buffer".into(), json!(self.double_buffer));
        m.insert("verbose".into(), json!(self.verbose));
        m.insert("name".into(), json!(self.name));
        Value::Object(m)
    }

    /// The trainer configuration these parameters describe. Data-dependent
    /// parts are left for the caller: `class_weights` (see
    /// [`ClassWeight::resolve`]), `label_values` and `standardizer` (see
    /// [`crate::FeatureStats`]) are None.
    pub fn train_config(&self, kind: ModelKind) -> TrainConfig {
        TrainConfig {
            kind,
            learning_rate: self.learning_rate,
            schedule: self.learning_rate_schedule.schedule(self.decay),
            l2: self.l2,
            l1: self.l1,
            batch_size: self.batch_size as usize,
            fit_intercept: self.fit_intercept,
            class_weights: None,
            label_values: None,
            standardizer: None,
        }
    }
}

fn rule(key: &str) -> &'static str {
    RULES
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, r)| *r)
        .unwrap_or("")
}

fn json_type(v: &Value) -> &'static str {
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

fn bad_value(key: &str, v: &Value, problem: &str) -> ParamError {
    ParamError {
        message: format!(
            "invalid value for parameter \"{key}\": {} ({problem})",
            show(v)
        ),
        hint: Some(format!("{key} must be {}", rule(key))),
    }
}

fn wrong_type(key: &str, v: &Value, expected: &str) -> ParamError {
    bad_value(
        key,
        v,
        &format!("expected {expected}, got {}", json_type(v)),
    )
}

fn unknown_key(key: &str) -> ParamError {
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

fn get_name(key: &str, v: &Value) -> Result<String, ParamError> {
    match v.as_str() {
        Some("") => Err(bad_value(key, v, "empty")),
        Some(s) => Ok(s.to_string()),
        None => Err(wrong_type(key, v, "a string")),
    }
}

const MAX_NAME_CHARS: usize = 200;

fn get_model_name(key: &str, v: &Value) -> Result<Option<String>, ParamError> {
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

fn get_features(key: &str, v: &Value) -> Result<Features, ParamError> {
    match v {
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

fn get_class_weight(key: &str, v: &Value) -> Result<Option<ClassWeight>, ParamError> {
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
                    _ => return Err(bad_value(
                        key,
                        v,
                        &format!(
                            "the weight of label \"{label}\" must be a number > 0 and <= 1000000"
                        ),
                    )),
                }
            }
            Ok(Some(ClassWeight::Map(m)))
        }
        _ => Err(wrong_type(key, v, "null, a string or an object")),
    }
}

fn get_validation(key: &str, v: &Value) -> Result<Option<Validation>, ParamError> {
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

fn get_bool(key: &str, v: &Value) -> Result<bool, ParamError> {
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

fn get_int(key: &str, v: &Value, min: u64, max: u64) -> Result<u64, ParamError> {
    let Value::Number(n) = v else {
        return Err(wrong_type(key, v, "an integer"));
    };
    let i = whole_number(n).ok_or_else(|| bad_value(key, v, "not an integer"))?;
    if i < i128::from(min) || i > i128::from(max) {
        return Err(bad_value(key, v, "out of range"));
    }
    Ok(i as u64)
}

fn get_float(key: &str, v: &Value, ok: impl Fn(f64) -> bool) -> Result<f64, ParamError> {
    let x = v.as_f64().ok_or_else(|| wrong_type(key, v, "a number"))?;
    // `ok` must also reject NaN; infinities are rejected here.
    if !x.is_finite() || !ok(x) {
        return Err(bad_value(key, v, "out of range"));
    }
    Ok(x)
}

fn get_shuffle(key: &str, v: &Value) -> Result<ShuffleMode, ParamError> {
    let s = v.as_str().ok_or_else(|| wrong_type(key, v, "a string"))?;
    ShuffleMode::parse(s).ok_or_else(|| bad_value(key, v, "unknown shuffle mode"))
}

fn get_block_size(key: &str, v: &Value) -> Result<BlockSize, ParamError> {
    match v {
        Value::String(s) if s == "auto" => Ok(BlockSize::Auto),
        Value::String(s) => parse_bytes(s)
            .map(BlockSize::Bytes)
            .map_err(|e| bad_value(key, v, &e)),
        Value::Number(_) => Ok(BlockSize::Pages(get_int(key, v, 1, MAX_BLOCK_PAGES)? as u32)),
        _ => Err(wrong_type(key, v, "a string or an integer")),
    }
}

fn get_buffer_size(key: &str, v: &Value) -> Result<BufferSize, ParamError> {
    match v {
        Value::String(s) => {
            if let Some(pct) = s.trim().strip_suffix('%') {
                // Plain decimal only: no signs, exponents, "inf" or "nan".
                let pct_s = pct.trim();
                let plain =
                    !pct_s.is_empty() && pct_s.chars().all(|c| c.is_ascii_digit() || c == '.');
                let pct: f64 = match pct_s.parse() {
                    Ok(x) if plain => x,
                    _ => return Err(bad_value(key, v, "not a percentage")),
                };
                if !(pct > 0.0 && pct <= 100.0) {
                    return Err(bad_value(key, v, "percentage out of range"));
                }
                Ok(BufferSize::Fraction(pct / 100.0))
            } else {
                parse_bytes(s)
                    .map(BufferSize::Bytes)
                    .map_err(|e| bad_value(key, v, &e))
            }
        }
        Value::Number(_) => Ok(BufferSize::Tuples(get_int(key, v, 1, u64::MAX)?)),
        _ => Err(wrong_type(key, v, "a string or an integer")),
    }
}

const UNITS: [(&str, u64); 5] = [
    ("TB", 1 << 40),
    ("GB", 1 << 30),
    ("MB", 1 << 20),
    ("kB", 1 << 10),
    ("B", 1),
];

/// Parses a memory size such as "10MB", "10 MB", "512kB", "2.5MB", "8192B":
/// a non-negative decimal number, optional spaces, and a unit (B, kB, MB, GB,
/// TB; case-insensitive; powers of 1024). Fractional bytes round to nearest.
/// The result must be at least 1 byte.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    if t.starts_with('-') {
        return Err("a size must be positive".to_string());
    }
    let not_a_size = || {
        format!("\"{s}\" is not a size; expected a number and a unit (B, kB, MB, GB, TB) such as \"64MB\"")
    };
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    if int_part.is_empty() && frac_part.is_empty() || frac_part.contains('.') {
        return Err(not_a_size());
    }
    if unit.is_empty() {
        return Err(format!(
            "\"{s}\" has no unit; use B, kB, MB, GB or TB, e.g. \"{num}MB\""
        ));
    }
    let mult = UNITS
        .iter()
        .find(|(u, _)| u.eq_ignore_ascii_case(unit))
        .map(|(_, m)| u128::from(*m))
        .ok_or_else(|| {
            format!("unknown unit \"{unit}\" in \"{s}\"; valid units are B, kB, MB, GB, TB")
        })?;
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    // ≤ 20 significant digits keeps digits · 2^40 well inside u128.
    if digits.len() > 20 {
        return Err(format!("\"{s}\" is too large"));
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| not_a_size())?
    };
    let frac_len = u32::try_from(frac_part.len()).unwrap_or(u32::MAX);
    let scale = 10u128
        .checked_pow(frac_len)
        .ok_or_else(|| format!("\"{s}\" has too many decimals"))?;
    let bytes = (mantissa * mult + scale / 2) / scale;
    if bytes == 0 {
        return Err("a size must be at least 1 byte".to_string());
    }
    u64::try_from(bytes).map_err(|_| format!("\"{s}\" is too large"))
}

/// "64MB" style with the largest unit that divides exactly (so it parses back
/// to the same number of bytes).
fn format_bytes_exact(b: u64) -> String {
    let (unit, m) = UNITS
        .iter()
        .find(|(_, m)| b.is_multiple_of(*m) && b >= *m)
        .copied()
        .unwrap_or(("B", 1));
    format!("{}{unit}", b / m)
}

/// Approximate "1.5GB" style for messages.
fn format_bytes_human(b: u128) -> String {
    let (unit, m) = UNITS
        .iter()
        .find(|(_, m)| b >= u128::from(*m))
        .copied()
        .unwrap_or(("B", 1));
    let v = b as f64 / m as f64;
    let s = format!("{v:.1}");
    format!("{}{unit}", s.strip_suffix(".0").unwrap_or(&s))
}

/// Shortest "12.5%" string that parses back to exactly `f`.
fn format_percent(f: f64) -> String {
    let pct = f * 100.0;
    let back = |s: &str| s.parse::<f64>().map(|p| p / 100.0) == Ok(f);
    for decimals in 0..=20 {
        let s = format!("{pct:.decimals$}");
        if back(&s) {
            return format!("{s}%");
        }
    }
    format!("{pct}%")
}

/// Blocks one buffer should hold under the automatic block size. The tuple shuffle only mixes
/// what is in one buffer, so a buffer of a few large blocks stays nearly as clustered as the
/// table: on a 200k-row label-clustered table (5 epochs, svm) 10%/2% buffers of ~6/~1 auto
/// blocks gave 0.803/0.614 test accuracy, 1-page blocks 0.855/0.853, Shuffle Once 0.854.
pub const AUTO_BLOCKS_PER_BUFFER: u64 = 256;

/// Pages per block. Auto: the buffer's pages / [`AUTO_BLOCKS_PER_BUFFER`], at most 1280 pages
/// (10MB of 8kB pages), at least 1. `buffer_pages` is the buffer's size in table pages (an
/// estimate is fine). Never more than the table (min 1).
pub fn resolve_block_pages(spec: BlockSize, n_pages: u32, page_size: u32, buffer_pages: u64) -> u32 {
    let pages = match spec {
        BlockSize::Auto => (buffer_pages / AUTO_BLOCKS_PER_BUFFER).clamp(1, 1280) as u32,
        BlockSize::Pages(p) => p,
        BlockSize::Bytes(b) => u32::try_from(b / u64::from(page_size.max(1))).unwrap_or(u32::MAX),
    };
    pages.clamp(1, n_pages.max(1))
}

/// Capacity in tuples of ONE buffer (see the module docs of the extension for
/// how buffers are used). `n_buffers` is 2 with double buffering, else 1;
/// `max_bytes` is the limit for all buffers together.
///
/// Fraction(f): ceil(f · table_bytes / bytes_per_tuple); Bytes(b):
/// b / bytes_per_tuple; Tuples(t): t; always at least 1. If the buffers would
/// exceed `max_bytes`, an explicit size is an error and the default is clamped.
pub fn resolve_buffer_tuples(
    spec: BufferSize,
    explicit: bool,
    n_features: usize,
    table_bytes: u64,
    n_buffers: u64,
    max_bytes: u64,
) -> Result<u64, ParamError> {
    let bpt = TupleArena::bytes_per_tuple(n_features);
    resolve_buffer_tuples_bytes(spec, explicit, bpt, table_bytes, n_buffers, max_bytes)
}

/// [`resolve_buffer_tuples`] for a given size of one tuple in memory, e.g.
/// [`TupleArena::bytes_per_sparse_tuple`] of the average nnz for sparse data.
pub fn resolve_buffer_tuples_bytes(
    spec: BufferSize,
    explicit: bool,
    bytes_per_tuple: usize,
    table_bytes: u64,
    n_buffers: u64,
    max_bytes: u64,
) -> Result<u64, ParamError> {
    let bpt = bytes_per_tuple.max(1) as u64;
    let n_buffers = n_buffers.max(1);
    let tuples = match spec {
        // `as` saturates, so absurd fractions cannot wrap.
        BufferSize::Fraction(f) => (f * table_bytes as f64 / bpt as f64).ceil() as u64,
        BufferSize::Bytes(b) => b / bpt,
        BufferSize::Tuples(t) => t,
    }
    .max(1);
    let total = u128::from(tuples) * u128::from(bpt) * u128::from(n_buffers);
    if total <= u128::from(max_bytes) {
        return Ok(tuples);
    }
    if !explicit {
        return Ok((max_bytes / n_buffers / bpt).max(1));
    }
    let given = match spec {
        BufferSize::Fraction(f) => format!("{} of the table", format_percent(f)),
        BufferSize::Bytes(b) => format_bytes_exact(b),
        BufferSize::Tuples(t) => format!("{t} tuples"),
    };
    let buffers = if n_buffers == 1 {
        "1 buffer".to_string()
    } else {
        format!("{n_buffers} buffers")
    };
    Err(ParamError {
        message: format!(
            "buffer_size of {given} ({tuples} tuples × {buffers} × {bpt} bytes = {}) exceeds corgipile.max_buffer_memory ({})",
            format_bytes_human(total),
            format_bytes_human(u128::from(max_bytes)),
        ),
        hint: Some(if n_buffers > 1 {
            "lower buffer_size, set double_buffer to false, or raise corgipile.max_buffer_memory".to_string()
        } else {
            "lower buffer_size or raise corgipile.max_buffer_memory".to_string()
        }),
    })
}
