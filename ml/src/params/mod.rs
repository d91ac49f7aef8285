//! Training parameters: parsed from the user's JSON object, validated, and
//! written back (defaults filled in) for storage with the model.
//!
//! Every key has exactly one name, a default and a range. Unknown keys are
//! errors (with a "did you mean" suggestion), so a typo never silently falls
//! back to a default.
//!
//! Each param is declared once, in the `train_params!` table below: its field, default,
//! how it is parsed and written back, the rule shown in error hints, and its row of the
//! param table of docs/reference.md (see [`param_table_markdown`]). [`TrainParams::KEYS`],
//! the list of valid keys in errors, [`TrainParams::defaults`], [`TrainParams::from_json`] and
//! [`TrainParams::to_json`] all derive from it.
//!
//! Files: `error` (why a param is refused), `json` (TrainParams from and to JSON, the checks across keys, the trainer's
//! configuration), `options` (shuffle mode, features, schedule, class weights, validation),
//! `sizing` (block and buffer sizes and their resolution), `units` (byte sizes and
//! percentages), `values` (JSON value readers and error messages).

mod error;
mod json;
mod options;
pub mod search;
mod sizing;
mod units;
mod values;

pub use error::ParamError;
pub use options::{
    ClassWeight, DeployRule, Features, ModelKey, OptimizerName, Patience, ScheduleKind,
    ShuffleMode, StatisticsPass, Validation, AUTO_MAX_EPOCHS, AUTO_MIN_IMPROVEMENT,
    AUTO_PATIENCE_ROWS, AUTO_VALIDATION_FRACTION,
};
pub use sizing::{
    resolve_block_pages, resolve_buffer_tuples, resolve_buffer_tuples_bytes, BlockSize, BufferSize,
    AUTO_BLOCKS_PER_BUFFER, GRADIENT_BUFFER_FLOOR,
};
pub use units::{format_bytes_human, parse_bytes};
pub use values::param_table_markdown;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::arena::MAX_FEATURES;
use crate::model::ModelKind;
use crate::network::Activation;
use crate::preprocess::PreprocessOptions;
use options::{class_weight_json, validation_json};
pub use search::Configuration;
use search::{Search, SelectBy, GROUP_KEYS, MAX_TRIALS, SEARCH_KEYS};
use sizing::{block_size_json, buffer_size_json, get_block_size, get_buffer_size, DEFAULT_BUFFER};
use values::{
    bad_value, get_bool, get_class_weight, get_features, get_filter, get_float, get_hidden,
    get_int, get_model_key, get_model_name, get_name, get_name_list, get_preprocess, get_shuffle,
    get_statistics, get_validation, json_type, unknown_key, wrong_type,
};

const MAX_EPOCHS: u64 = 1_000_000;
/// At most this many `group_by` columns.
const MAX_GROUP_COLUMNS: usize = 8;
/// With `since`: the default share of the older blocks read again each epoch (chosen by
/// `make bench-incremental`, see bench/results/incremental.md).
pub const DEFAULT_REPLAY: f64 = 0.1;
/// With `group_by`: the default fewest rows of a group with a model of its own.
pub const DEFAULT_MIN_GROUP_ROWS: u64 = 100;
const MAX_BATCH: u64 = 1_000_000;
const MAX_RATE: f64 = 1e6;
const MAX_SEED: u64 = i64::MAX as u64; // fits a PostgreSQL bigint
/// The most factors per feature and output of a factorization machine (`factors`).
pub const MAX_FACTORS: usize = 256;

/// Keys only some families take (each family's `own_keys`): absent from the stored params of a
/// kind whose family does not take them.
pub const FAMILY_KEYS: [&str; 5] = ["hidden", "activation", "optimizer", "momentum", "factors"];

/// One training parameter, as declared in the `train_params!` table.
#[derive(Clone, Copy)]
pub struct ParamSpec {
    /// The JSON key (and field of [`TrainParams`]).
    pub name: &'static str,
    /// docs/reference.md: the default as shown to users.
    pub shown_default: &'static str,
    /// docs/reference.md: the accepted values.
    pub accepts: &'static str,
    /// docs/reference.md: what the param means.
    pub meaning: &'static str,
    /// What the key accepts and its default, for the hint of an invalid value
    /// ("<key> must be <rule>").
    pub rule: &'static str,
    /// Parses the key's JSON value into its field.
    parse: fn(&mut TrainParams, &str, &Value) -> Result<(), ParamError>,
    /// The field as written back by [`TrainParams::to_json`].
    to_json: fn(&TrainParams) -> Value,
}

impl std::fmt::Debug for ParamSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamSpec")
            .field("name", &self.name)
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

/// The first of its arguments: a param's JSON key (`key:`, for a name Rust reserves such as
/// `where`), else its field's name.
macro_rules! first_of {
    ($first:expr $(, $rest:expr)*) => {
        $first
    };
}

/// Declares [`TrainParams`] (one field per param plus the explicit-size flags), its
/// defaults, [`TrainParams::KEYS`] and [`PARAMS`] from one entry per param:
///
/// ```text
/// /// field docs
/// name: Type = default expression => {
///     key: JSON key when it is not the field's name (optional),
///     shown: docs/reference.md default, accepts: its accepted values, meaning: its meaning,
///     rule: hint text, parse: fn(&str, &Value) -> Result<Type, ParamError>,
///     json: fn(&Type) -> Value,
/// },
/// ```
macro_rules! train_params {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $default:expr => {
            $(key: $key:literal,)?
            shown: $shown:literal,
            accepts: $accepts:literal,
            meaning: $meaning:literal,
            rule: $rule:literal,
            parse: $parse:expr,
            json: $json:expr $(,)?
        },
    )*) => {
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub struct TrainParams {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("\n\nAccepts ", $rule, ".")]
                pub $field: $ty,
            )*
            /// True iff buffer_size differs from the default ("10%"). An explicit size
            /// that exceeds the memory limit is an error; the default is clamped.
            pub buffer_size_explicit: bool,
        }

        impl TrainParams {
            /// All valid keys, in documentation order.
            pub const KEYS: &'static [&'static str] = &[$(first_of!($($key,)? stringify!($field))),*];

            pub fn defaults() -> Self {
                TrainParams {
                    $($field: $default,)*
                    buffer_size_explicit: false,
                }
            }
        }

        /// Every training parameter, in documentation order.
        pub const PARAMS: &[ParamSpec] = &[$(
            ParamSpec {
                name: first_of!($($key,)? stringify!($field)),
                shown_default: $shown,
                accepts: $accepts,
                meaning: $meaning,
                rule: $rule,
                parse: |p, key, v| {
                    let parse: fn(&str, &Value) -> Result<$ty, ParamError> = $parse;
                    p.$field = parse(key, v)?;
                    Ok(())
                },
                to_json: |p| {
                    let json: fn(&$ty) -> Value = $json;
                    json(&p.$field)
                },
            },
        )*];
    };
}

train_params! {
    /// Where the features come from.
    features: Features = Features::Column("features".to_string()) => {
        shown: r#"`"features"`"#,
        accepts: r#"array column name, array of column names, `"*"`, or `{"indices": .., "values": ..}`"#,
        meaning: "see [Features](#features)",
        rule: "a non-empty string naming one array column (default \"features\"), an array of distinct column names of any encodable type, \"*\" for every column but the label, or {\"indices\": column, \"values\": column} for sparse rows",
        parse: get_features,
        json: Features::to_json,
    },
    /// The label column.
    label: String = "label".to_string() => {
        shown: r#"`"label"`"#,
        accepts: "column name",
        meaning: "the label column",
        rule: "a non-empty string naming the label column (default \"label\")",
        parse: get_name,
        json: |x| json!(x),
    },
    epochs: u32 = 20 => {
        shown: "`20`",
        accepts: "integer 1 … 1,000,000",
        meaning: "passes over the table; networks and fm kinds given none of `epochs`, `validation`, `patience` (and no `search`, `folds`, `group_by`, `tolerance`, `warm_start`, `since`) train at most 200 and stop on 10% held-out rows: see [Training enough by default](training.md#training-enough-by-default)",
        rule: "an integer from 1 to 1000000 (default 20)",
        parse: |k, v| Ok(get_int(k, v, 1, MAX_EPOCHS)? as u32),
        json: |x| json!(x),
    },
    learning_rate: f64 = 0.01 => {
        shown: "`0.01`",
        accepts: "number > 0, ≤ 1e6",
        meaning: "initial SGD step size",
        rule: "a number > 0 and <= 1000000 (default 0.01)",
        parse: |k, v| get_float(k, v, |x| x > 0.0 && x <= MAX_RATE),
        json: |x| json!(x),
    },
    learning_rate_schedule: ScheduleKind = ScheduleKind::Exponential => {
        shown: r#"`"exponential"`"#,
        accepts: r#"`"constant"`, `"exponential"`, `"inverse_sqrt"`"#,
        meaning: "lr of epoch *e*: constant; `learning_rate × decay^(e-1)`; `learning_rate / √e`",
        rule: "one of \"constant\", \"exponential\" (learning_rate·decay^(epoch-1)), \"inverse_sqrt\" (learning_rate/sqrt(epoch)) (default \"exponential\")",
        parse: |k, v| {
            let s = v.as_str().ok_or_else(|| wrong_type(k, v, "a string"))?;
            ScheduleKind::parse(s).ok_or_else(|| bad_value(k, v, "unknown schedule"))
        },
        json: |s| json!(s.name()),
    },
    decay: f64 = 0.95 => {
        shown: "`0.95`",
        accepts: "number in (0, 1]",
        meaning: "the exponential schedule's factor",
        rule: "a number > 0 and <= 1, the learning-rate multiplier per epoch (default 0.95)",
        parse: |k, v| get_float(k, v, |x| x > 0.0 && x <= 1.0),
        json: |x| json!(x),
    },
    l2: f64 = 0.0 => {
        shown: "`0`",
        accepts: "number ≥ 0, ≤ 1e6",
        meaning: "L2 regularization (bias not regularized)",
        rule: "a number >= 0 and <= 1000000 (default 0)",
        parse: |k, v| get_float(k, v, |x| (0.0..=MAX_RATE).contains(&x)),
        json: |x| json!(x),
    },
    l1: f64 = 0.0 => {
        shown: "`0`",
        accepts: "number ≥ 0, ≤ 1e6",
        meaning: "L1 regularization (truncated gradient: exact zeros)",
        rule: "a number >= 0 and <= 1000000 (default 0)",
        parse: |k, v| get_float(k, v, |x| (0.0..=MAX_RATE).contains(&x)),
        json: |x| json!(x),
    },
    batch_size: u32 = 1 => {
        shown: "`1`",
        accepts: "integer 1 … 1,000,000",
        meaning: "1 = per-tuple SGD; > 1 = mini-batch (averaged gradient)",
        rule: "an integer from 1 to 1000000 (default 1)",
        parse: |k, v| Ok(get_int(k, v, 1, MAX_BATCH)? as u32),
        json: |x| json!(x),
    },
    fit_intercept: bool = true => {
        shown: "`true`",
        accepts: "boolean",
        meaning: "learn a bias; `false` keeps it at 0",
        rule: "true or false: learn a bias term (default true)",
        parse: get_bool,
        json: |x| json!(x),
    },
    normalize: bool = true => {
        shown: "`true`",
        accepts: "boolean",
        meaning: "standardize each numeric feature while training (mean/std from the statistics pass; sparse arrays: scale only); the stored weights are in the table's units",
        rule: "true or false: standardize the features (default true)",
        parse: get_bool,
        json: |x| json!(x),
    },
    /// How the statistics pass reads the table.
    statistics: StatisticsPass = StatisticsPass::Sample => {
        shown: "`\"sample\"`",
        accepts: r#"`"sample"`, `"exact"`"#,
        meaning: "`\"sample\"`: when the statistics pass learns only means and scales (`normalize` of array features, a column list without one-hot columns), it reads a random twentieth of the table's blocks (at least 10 MB and 50,000 rows; a smaller table whole); `\"exact\"`: every row. One-hot categories, class weights, networks, groups and a validation split always read every row",
        rule: "\"sample\" or \"exact\" (default \"sample\")",
        parse: get_statistics,
        json: |x| json!(x.name()),
    },
    /// With `"features": "*"`: columns left out.
    exclude: Vec<String> = Vec::new() => {
        shown: "`[]`",
        accepts: "array of column names",
        meaning: r#"with `"features": "*"`: the columns not to use"#,
        rule: "an array of distinct column names, used with \"features\": \"*\" (default [])",
        parse: get_name_list,
        json: |x| json!(x),
    },
    /// Per-column preprocessing of a column list.
    preprocess: PreprocessOptions = PreprocessOptions::new() => {
        shown: "`{}`",
        accepts: r#"`{"column": {"encode": .., "buckets": .., "bins": .., "impute": .., "scale": ..}}`; key `"*"`: every column's default"#,
        meaning: "per-column options of a column list, see [Preprocessing](#preprocessing)",
        rule: "an object mapping feature column names (or \"*\", the default of every column, where an option fits its type) to options: {\"encode\": \"one_hot\" | \"hash\" (text) | \"ple\" | \"none\" (numbers), \"buckets\": 1 .. 16777216 (hash only, default 1024), \"bins\": 2 .. 1024 (ple only, default 16), \"impute\": \"mean\" | \"zero\" | \"category\" | \"skip\" | \"error\", \"scale\": \"standard\" | \"none\"} (default {})",
        parse: get_preprocess,
        json: |x| json!(x.iter().map(|(k, o)| (k.clone(), o.to_json())).collect::<Map<String, Value>>()),
    },
    /// One-hot columns keep their most frequent categories; the rest are "(other)".
    max_categories: u32 = 100 => {
        shown: "`100`",
        accepts: "integer 1 … 65,536",
        meaning: "one-hot text columns: the most frequent categories kept, the rest pooled into `(other)`",
        rule: "an integer from 1 to 65536 (default 100)",
        parse: |k, v| Ok(get_int(k, v, 1, 65_536)? as u32),
        json: |x| json!(x),
    },
    /// Read the named table alone, not its inheritance children (as `FROM ONLY`).
    only: bool = false => {
        shown: "`false`",
        accepts: "boolean",
        meaning: "`false` reads a table as SELECT does: a partitioned table's partitions and a table's inheritance children, all their blocks shuffled as one pool; `true` reads the named table's own rows only (as `FROM ONLY`; an ERROR for a partitioned table, which has none)",
        rule: "true or false (default false)",
        parse: get_bool,
        json: |x| json!(x),
    },
    /// `"where"`: the rows to train on (or evaluate), as one boolean SQL expression.
    filter: Option<String> = None => {
        key: "where",
        shown: "`null`",
        accepts: r#"a boolean SQL expression over the relation's columns, e.g. `"created_at >= '2026-01-01' AND region = 'EU'"`"#,
        meaning: "train (or evaluate) on the rows for which it is true, as a WHERE clause: one expression over the relation's columns, without subqueries, aggregates, window, set-returning or volatile functions; applied with row-level security, read by the same block scan; see [Training on a subset](#training-on-a-subset-where)",
        rule: "null or a non-empty string of at most 10000 characters holding one boolean SQL expression over the relation's columns (default null)",
        parse: get_filter,
        json: |x| json!(x),
    },
    /// Return the average of the iterates (from epoch 2 on) instead of the last one.
    average: bool = true => {
        shown: "`true`",
        accepts: "boolean",
        meaning: "return the average of the SGD iterates from epoch 2 on (epoch 1 if it is the only one), as scikit-learn's `SGDClassifier(average=True)`; `false` = the last iterate",
        rule: "true or false: average the iterates (default true)",
        parse: get_bool,
        json: |x| json!(x),
    },
    /// Standard errors and p-values: Newton passes to the maximum-likelihood estimate after the
    /// epochs (see `crate::inference`).
    inference: bool = false => {
        shown: "`false`",
        accepts: "boolean",
        meaning: "`logistic`, `linear`: after the epochs, polish the model to the exact maximum-likelihood estimate by Newton passes over the table and store each coefficient's standard error, z (logistic) or t (linear) statistic, p-value, 95% interval and odds ratio (logistic), shown by `corgipile_model_coefficients`; one extra pass per Newton iteration; see [Standard errors and p-values](#standard-errors-and-p-values)",
        rule: "true or false (default false); logistic and linear only, without \"l1\" or \"class_weight\"",
        parse: get_bool,
        json: |x| json!(x),
    },
    class_weight: Option<ClassWeight> = None => {
        shown: "`null`",
        accepts: r#"`"balanced"` or a map from label value to weight, e.g. `{"1": 5}` (a boolean label: `{"true": 5}`)"#,
        meaning: "weight each class's loss (balanced = n / (K·n_class), as scikit-learn); costs one extra pass",
        rule: "null, \"balanced\", or an object mapping label values to weights > 0 such as {\"1\": 5} (default null)",
        parse: get_class_weight,
        json: class_weight_json,
    },
    /// Sparse features only: the dimension (None: inferred from the indices).
    n_features: Option<u32> = None => {
        shown: "`null`",
        accepts: "integer ≥ 1, within `corgipile.max_model_memory`",
        meaning: "sparse features only: the dimension (checked against the setting before the table is read)",
        rule: "null (inferred from the indices) or an integer from 1 to 2147483647 (default null)",
        parse: |k, v| {
            Ok(if v.is_null() {
                None
            } else {
                Some(get_int(k, v, 1, MAX_FEATURES as u64)? as u32)
            })
        },
        json: |x| json!(x),
    },
    /// Sparse features only: index of the first feature, 0 or 1.
    index_base: u8 = 1 => {
        shown: "`1`",
        accepts: "`0` or `1`",
        meaning: "sparse features only: the first index",
        rule: "0 or 1, the index of the first sparse feature (default 1)",
        parse: |k, v| Ok(get_int(k, v, 0, 1)? as u8),
        json: |x| json!(x),
    },
    validation: Option<Validation> = None => {
        shown: "`null`",
        accepts: r#"`{"fraction": 0.2}`, `{"predicate": "id % 5 = 0"}`, `{"relation": "test_table"}`"#,
        meaning: "rows held out of training (`{\"fraction\": 0.1}` by default for networks and fm kinds that stop early by default; a fixed hash of the ctid; a boolean SQL expression over the row; another table with the same columns), evaluated after every epoch into `corgipile.epochs.validation_*`; the predicate is one boolean expression over the table's columns, without subqueries, aggregates, window, set-returning or volatile functions",
        rule: "null, {\"fraction\": f} with 0 < f < 1, {\"relation\": name} or {\"predicate\": sql} (default null)",
        parse: get_validation,
        json: validation_json,
    },
    tolerance: f64 = 0.0 => {
        shown: "`0`",
        accepts: "number ≥ 0",
        meaning: "stop early when the epoch loss changes by less than this; 0 = off",
        rule: "a number >= 0; 0 turns early stopping off (default 0)",
        parse: |k, v| get_float(k, v, |x| x >= 0.0),
        json: |x| json!(x),
    },
    seed: Option<u64> = None => {
        shown: "random",
        accepts: "integer 0 … 2^63-1, or `null`",
        meaning: "same seed + same data = identical model; the seed used is stored",
        rule: "an integer from 0 to 9223372036854775807, or null for a random seed (default null)",
        parse: |k, v| {
            Ok(if v.is_null() {
                None
            } else {
                Some(get_int(k, v, 0, MAX_SEED)?)
            })
        },
        json: |x| json!(x),
    },
    shuffle: ShuffleMode = ShuffleMode::Corgipile => {
        shown: r#"`"corgipile"`"#,
        accepts: r#"`"corgipile"`, `"block_only"`, `"no_shuffle"`, `"sliding_window"`, `"mrs"`"#,
        meaning: "see [Strategies](#strategies)",
        rule: "one of \"corgipile\", \"block_only\", \"no_shuffle\", \"sliding_window\", \"mrs\" (default \"corgipile\")",
        parse: get_shuffle,
        json: |s| json!(s.name()),
    },
    block_size: BlockSize = BlockSize::Auto => {
        shown: r#"`"auto"`"#,
        accepts: r#"`"auto"`, a size (`"10MB"`, `"512kB"`), or a number of pages"#,
        meaning: "pages per block; auto = the buffer's size / 256, at most 10 MB (see [Choosing sizes](#choosing-buffer-and-block-sizes))",
        rule: "\"auto\", a size such as \"10MB\", or a number of pages from 1 to 2147483648 (default \"auto\")",
        parse: get_block_size,
        json: block_size_json,
    },
    buffer_size: BufferSize = DEFAULT_BUFFER => {
        shown: r#"`"10%"`"#,
        accepts: r#"a percentage of the table's size (`"5%"`), a size (`"64MB"`), or a number of tuples"#,
        meaning: "tuples per shuffle buffer (window / reservoir for the baselines); not given, networks and fm kinds take at least 16 MB of the table (or all of it), stored as a percentage",
        rule: "a percentage of the table such as \"10%\" (above 0% and at most 100%), a size such as \"64MB\", or a number of tuples >= 1 (default \"10%\")",
        parse: get_buffer_size,
        json: buffer_size_json,
    },
    double_buffer: bool = true => {
        shown: "`true`",
        accepts: "boolean",
        meaning: "fill the next buffer while a worker thread trains on the current one",
        rule: "true or false (default true)",
        parse: get_bool,
        json: |x| json!(x),
    },
    /// PostgreSQL parallel workers that train beside the backend (see `workers` in
    /// docs/reference.md).
    workers: u32 = 0 => {
        shown: "`0`",
        accepts: "integer 0 … 64",
        meaning: "parallel worker processes that train beside the backend, each on its share of every epoch's blocks, exchanging with one shared model (see [Parallel training](#parallel-training)); 0 = the backend alone",
        rule: "an integer from 0 to 64 (default 0)",
        parse: |k, v| Ok(get_int(k, v, 0, 64)? as u32),
        json: |x| json!(x),
    },
    /// Sharded tables: rounds per epoch; None = auto (see `sync_rounds`).
    sync: Option<u32> = None => {
        shown: r#"`"auto"`"#,
        accepts: r#"`"auto"` or integer 1 … 1,000"#,
        meaning: "sharded tables (postgres_fdw partitions): rounds per epoch; each round every shard trains on a share of its blocks from the combined model; auto = 64, fewer for a model of more than 16,384 weights (see [Scaling out](#scaling-out-sharded-tables))",
        rule: "\"auto\" or an integer from 1 to 1000 (default \"auto\")",
        parse: |k, v| match v {
            Value::String(s) if s == "auto" => Ok(None),
            _ => Ok(Some(get_int(k, v, 1, 1000)? as u32)),
        },
        json: |x| x.map_or(json!("auto"), |n| json!(n)),
    },
    verbose: bool = true => {
        shown: "`true`",
        accepts: "boolean",
        meaning: "one NOTICE per epoch",
        rule: "true or false: report progress once per epoch (default true)",
        parse: get_bool,
        json: |x| json!(x),
    },
    /// mlp kinds: the hidden layers' widths (None for linear kinds).
    hidden: Option<Vec<u32>> = None => {
        shown: "`[64]` (mlp kinds)",
        accepts: "array of 1–16 integers 1 … 65,536",
        meaning: "`mlp`, `mlp_regression`: the width of each hidden layer, first to last",
        rule: "an array of 1 to 16 integers from 1 to 65536, the widths of the hidden layers (default [64]); mlp and mlp_regression only",
        parse: get_hidden,
        json: |x| json!(x),
    },
    /// mlp kinds: the hidden layers' non-linearity.
    activation: Option<Activation> = None => {
        shown: r#"`"relu"` (mlp kinds)"#,
        accepts: r#"`"relu"`, `"tanh"`"#,
        meaning: "`mlp`, `mlp_regression`: the hidden layers' activation (weights drawn He-uniform for relu, Glorot-uniform for tanh)",
        rule: "\"relu\" or \"tanh\" (default \"relu\"); mlp and mlp_regression only",
        parse: |k, v| {
            let s = v.as_str().ok_or_else(|| wrong_type(k, v, "a string"))?;
            Activation::parse(s).map(Some).ok_or_else(|| bad_value(k, v, "unknown activation"))
        },
        json: |x| json!(x.map(Activation::name)),
    },
    /// mlp kinds: how the parameters move along the gradient.
    optimizer: Option<OptimizerName> = None => {
        shown: r#"`"adam"` (mlp and fm kinds)"#,
        accepts: r#"`"adam"`, `"sgd"`"#,
        meaning: "`mlp`, `mlp_regression`, `fm`, `fm_regression`: Adam (β₁ 0.9, β₂ 0.999) or SGD with `momentum`",
        rule: "\"adam\" or \"sgd\" (default \"adam\"); mlp, mlp_regression, fm and fm_regression only",
        parse: |k, v| {
            let s = v.as_str().ok_or_else(|| wrong_type(k, v, "a string"))?;
            OptimizerName::parse(s).map(Some).ok_or_else(|| bad_value(k, v, "unknown optimizer"))
        },
        json: |x| json!(x.map(OptimizerName::name)),
    },
    /// mlp kinds with `"optimizer": "sgd"`: the momentum.
    momentum: Option<f64> = None => {
        shown: "`0.9` (mlp and fm kinds)",
        accepts: "number in [0, 1)",
        meaning: r#"`mlp`, `mlp_regression`, `fm`, `fm_regression` with `"optimizer": "sgd"`: heavy-ball momentum"#,
        rule: "a number >= 0 and < 1 (default 0.9); mlp, mlp_regression, fm and fm_regression with \"optimizer\": \"sgd\" only",
        parse: |k, v| get_float(k, v, |x| (0.0..1.0).contains(&x)).map(Some),
        json: |x| json!(x),
    },
    /// fm kinds: the factors of each feature (and output) whose dot products weigh pairs.
    factors: Option<u32> = None => {
        shown: "`8` (fm kinds)",
        accepts: "integer 1 … 256",
        meaning: "`fm`, `fm_regression`: the length of each feature's factor vector; a pair of features interacts through their factors' dot product",
        rule: "an integer from 1 to 256 (default 8); fm and fm_regression only",
        parse: |k, v| get_int(k, v, 1, MAX_FACTORS as u64).map(|n| Some(n as u32)),
        json: |x| json!(x),
    },
    /// Early stopping on the validation loss.
    patience: Option<Patience> = None => {
        shown: "`null`",
        accepts: "integer 1 … 1,000,000, `\"auto\"`, or `null`",
        meaning: "with `validation`: stop when the validation loss has not improved for this many epochs, and keep the best epoch's model; `\"auto\"`: for about 600,000 training rows (2 to 10 epochs) without improving by 0.01%; `null` = train every epoch. See [Training enough by default](training.md#training-enough-by-default)",
        rule: "null, \"auto\" or an integer from 1 to 1000000; needs \"validation\" (default null)",
        parse: |k, v| {
            Ok(match v {
                Value::Null => None,
                Value::String(s) if s == "auto" => Some(Patience::Auto),
                _ => Some(Patience::Epochs(get_int(k, v, 1, MAX_EPOCHS)? as u32)),
            })
        },
        json: |x| x.map_or(Value::Null, Patience::to_json),
    },
    /// Hyperparameter search: configurations trained side by side in one pass.
    search: Option<Search> = None => {
        shown: "`null`",
        accepts: r#"`{"learning_rate": [0.001, 0.01], "l2": [0, 0.0001], ...}`"#,
        meaning: "train every combination of these values side by side on the same shuffled buffers, each scored on the same validation rows (default `{\"fraction\": 0.2}`), every one stored as a version of `name`, the best (`select_by`) last; see [Search](#search-many-configurations-in-one-pass)",
        rule: "null or an object mapping learning_rate, learning_rate_schedule, decay, l2, l1, batch_size, average, hidden, activation, optimizer, momentum or factors to a non-empty array of values, at most 256 combinations (default null)",
        parse: |k, v| Search::parse(k, v).map(Some),
        json: |x| x.as_ref().map_or(Value::Null, Search::to_json),
    },
    /// With `search`: train a seeded random sample of this many configurations of the grid.
    search_trials: Option<u32> = None => {
        shown: "`null`",
        accepts: "integer 1 … 256, or `null`",
        meaning: "with `search`: a random sample of this many configurations of the grid (drawn from `seed`); `null` = every configuration",
        rule: "null or an integer from 1 to 256; needs \"search\" (default null)",
        parse: |k, v| {
            Ok(if v.is_null() {
                None
            } else {
                Some(get_int(k, v, 1, MAX_TRIALS as u64)? as u32)
            })
        },
        json: |x| json!(x),
    },
    /// With `search`: what ranks the configurations.
    select_by: Option<SelectBy> = None => {
        shown: "`null`",
        accepts: r#"`"accuracy"` (classifiers), `"r2"` (regression), `"loss"`, `"f1"`, `"roc_auc"` (svm, logistic), `"log_loss"` (logistic, softmax, mlp)"#,
        meaning: "with `search`: the validation score that picks the best configuration (`loss`, `log_loss`: the lowest); `null` = accuracy for classifiers, R² for regression",
        rule: "\"accuracy\" (classifiers), \"r2\" (regression), \"loss\", \"f1\" or \"roc_auc\" (svm, logistic), \"log_loss\" (logistic, softmax, mlp); needs \"search\"; null ranks classifiers by accuracy and regression by r2 (default null)",
        parse: |k, v| {
            let s = v.as_str().ok_or_else(|| wrong_type(k, v, "a string"))?;
            SelectBy::parse(s).map(Some).ok_or_else(|| bad_value(k, v, "unknown score"))
        },
        json: |x| json!(x.map(SelectBy::name)),
    },
    /// k-fold cross-validation in the same pass.
    folds: Option<u32> = None => {
        shown: "`null`",
        accepts: "integer 2 … 20, or `null`",
        meaning: "k-fold cross-validation in the same pass: each row's fold is a fixed hash of the row; k models train beside the stored one (all rows), each on the other folds, scored on its own fold during the last epoch (per fold, mean and spread in `metrics->'cv'`; with `search`, configurations ranked by the mean); not with `validation`",
        rule: "null or an integer from 2 to 20; not with \"validation\" (default null)",
        parse: |k, v| {
            Ok(if v.is_null() {
                None
            } else {
                Some(get_int(k, v, 2, 20)? as u32)
            })
        },
        json: |x| json!(x),
    },
    /// Per-group models: one model per distinct value of these columns, from one scan.
    group_by: Option<Vec<String>> = None => {
        shown: "`null`",
        accepts: r#"column name, or array of 1 … 8 column names"#,
        meaning: "one model per distinct value (combination) of these columns, all trained side by side in one pass beside a model of every row; a group with fewer than `min_group_rows` rows gets no model of its own, and its rows are predicted by the model of every row; see [Per-group models](#per-group-models-one-scan-one-model-per-group)",
        rule: "null, a column name or an array of 1 to 8 distinct column names; needs \"name\" (default null)",
        parse: |k, v| {
            let names = match v {
                Value::Null => return Ok(None),
                Value::String(_) => vec![get_name(k, v)?],
                _ => get_name_list(k, v)?,
            };
            if names.is_empty() || names.len() > MAX_GROUP_COLUMNS {
                return Err(bad_value(k, v, "give 1 to 8 columns"));
            }
            Ok(Some(names))
        },
        json: |x| json!(x),
    },
    /// With `group_by`: the fewest rows a group needs for a model of its own.
    min_group_rows: Option<u64> = None => {
        shown: "`100` (with `group_by`)",
        accepts: "integer 1 … 1,000,000,000",
        meaning: "with `group_by`: a group with fewer rows (counted by the statistics pass) gets no model of its own; the model of every row predicts its rows",
        rule: "an integer from 1 to 1000000000; needs \"group_by\" (default 100)",
        parse: |k, v| Ok(Some(get_int(k, v, 1, 1_000_000_000)?)),
        json: |x| json!(x),
    },
    /// Continue from a stored model's parameters.
    warm_start: Option<ModelKey> = None => {
        shown: "`null`",
        accepts: "a model id, or a model name (its deployed version)",
        meaning: "start from that model's parameters instead of zeros: same kind, features (a column list keeps its stored preprocessing) and shape (a network's `hidden` and `activation`, an fm's `factors`: the model's unless given), on the rows read now; the model stored is the next version of its name (unless `name` says otherwise); see [Warm starts](#warm-starts-continue-from-a-stored-model)",
        rule: "null, a model id (an integer >= 1) or a model name (default null); not with \"folds\" or \"group_by\"",
        parse: get_model_key,
        json: |x| x.as_ref().map_or(Value::Null, ModelKey::to_json),
    },
    /// Incremental training: only the blocks added since that model was trained.
    since: Option<ModelKey> = None => {
        shown: "`null`",
        accepts: "a model id, or a model name (its deployed version)",
        meaning: "read only the table's pages added since that model was trained (it records the table's size), plus a `replay` sample of the older ones, and continue from that model (`warm_start`); see [Incremental training](#incremental-training-since)",
        rule: "null, a model id (an integer >= 1) or a model name (default null); not with \"folds\" or \"group_by\"",
        parse: get_model_key,
        json: |x| x.as_ref().map_or(Value::Null, ModelKey::to_json),
    },
    /// With `since`: the fraction of the older blocks read again each epoch.
    replay: Option<f64> = None => {
        shown: "`0.1` (with `since`)",
        accepts: "number in [0, 1]",
        meaning: "with `since`: the fraction of the older blocks read again each epoch (a fresh uniform sample per epoch), so the model does not forget them",
        rule: "a number >= 0 and <= 1; needs \"since\" (default 0.1)",
        parse: |k, v| get_float(k, v, |x| (0.0..=1.0).contains(&x)).map(Some),
        json: |x| json!(x),
    },
    /// The model's name: each training of a name stores a new version of it.
    name: Option<String> = None => {
        shown: "`null`",
        accepts: "string of 1–200 characters, no leading/trailing blanks, not an integer",
        meaning: "store the model as the next version of this name (a text argument that is an integer means a model id: `corgipile_predict('7', f)` is model 7)",
        rule: "null or a string of 1 to 200 characters, not an integer, naming the model; each training of a name stores a new version (default null)",
        parse: get_model_name,
        json: |x| json!(x),
    },
    /// A quality gate on the version this training stores (see `DeployRule`).
    deploy: Option<DeployRule> = None => {
        shown: "`null`",
        accepts: r#"`"if_better"` or `null`"#,
        meaning: "with `name`: `\"if_better\"` stores the new version, scores it and the deployed one on the training's held-out rows (its `validation`, or a network's default; accuracy for classifiers, R² for regression) and deploys the new one only if it scores more than `margin` higher, else keeps the deployed one (pinned); `null`: the newest version is deployed unless one is pinned. Every decision is a row of [`corgipile.deployments`](#corgipiledeployments); see [Deploying only a better version](#deploying-only-a-better-version-deploy)",
        rule: "null or \"if_better\"; needs \"name\" and held-out rows (\"validation\"), not with \"workers\", \"group_by\" or \"folds\" (default null)",
        parse: |k, v| match v {
            Value::Null => Ok(None),
            _ => {
                let s = v.as_str().ok_or_else(|| wrong_type(k, v, "a string"))?;
                DeployRule::parse(s).map(Some).ok_or_else(|| bad_value(k, v, "unknown deploy rule"))
            }
        },
        json: |x| json!(x.map(DeployRule::name)),
    },
    /// With `"deploy": "if_better"`: how much higher the new version must score.
    margin: Option<f64> = None => {
        shown: "`0` (with `deploy`)",
        accepts: "number in [0, 1]",
        meaning: "with `\"deploy\": \"if_better\"`: how much higher (absolute accuracy or R²) the new version must score than the deployed one to replace it; with 0 it must score higher, a tie keeps the deployed version",
        rule: "a number >= 0 and <= 1; needs \"deploy\": \"if_better\" (default 0)",
        parse: |k, v| get_float(k, v, |x| (0.0..=1.0).contains(&x)).map(Some),
        json: |x| json!(x),
    },
}
