//! The parameters' value types that are not sizes: shuffle mode, feature source,
//! learning-rate schedule, class weights and validation rows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::ParamError;
use crate::network::OptimizerKind;
use crate::stats::balanced_class_weights;

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

/// How the statistics pass before training reads the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatisticsPass {
    /// Means and scales from a uniform sample of the table's blocks, where means and scales
    /// are all the pass learns (see `SAMPLE_FRACTION`); otherwise every row.
    Sample,
    /// Every row, always.
    Exact,
}

impl StatisticsPass {
    /// The share of the table's pages a sampled pass reads at least...
    pub const SAMPLE_FRACTION: f64 = 0.05;
    /// ... and at least this many pages (8 kB each: 10 MB), so that a small table is read
    /// whole (its statistics then are exact) ...
    pub const SAMPLE_MIN_PAGES: u64 = 1280;
    /// ... and it reads on, block by random block, until it has seen this many training rows
    /// (a selective `where` may leave few in a tenth of the table).
    pub const SAMPLE_MIN_ROWS: u64 = 50_000;

    pub fn name(self) -> &'static str {
        match self {
            StatisticsPass::Sample => "sample",
            StatisticsPass::Exact => "exact",
        }
    }

    pub fn parse(name: &str) -> Option<StatisticsPass> {
        [StatisticsPass::Sample, StatisticsPass::Exact]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// Where the features come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Features {
    /// One array column (JSON: a string).
    Column(String),
    /// Several columns of any encodable type (JSON: an array of names).
    Columns(Vec<String>),
    /// Every column but the label and the `exclude` list (JSON: "*").
    All,
    /// Sparse rows from an index array column and a value array column
    /// (JSON: {"indices": "col", "values": "col"}).
    Sparse { indices: String, values: String },
}

impl Features {
    pub fn is_sparse(&self) -> bool {
        matches!(self, Features::Sparse { .. })
    }

    /// Columns preprocessed one by one (a list, or "*"), as opposed to an array column or
    /// a sparse pair.
    pub fn is_tabular(&self) -> bool {
        matches!(self, Features::Columns(_) | Features::All)
    }

    /// As written back by `TrainParams::to_json`.
    pub(super) fn to_json(&self) -> Value {
        match self {
            Features::Column(c) => json!(c),
            Features::Columns(cs) => json!(cs),
            Features::All => json!("*"),
            Features::Sparse { indices, values } => json!({"indices": indices, "values": values}),
        }
    }
}

/// A network's optimizer by name (`"momentum"` is its own param).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerName {
    Adam,
    Sgd,
}

impl OptimizerName {
    pub fn name(self) -> &'static str {
        match self {
            OptimizerName::Adam => "adam",
            OptimizerName::Sgd => "sgd",
        }
    }

    pub fn parse(name: &str) -> Option<OptimizerName> {
        [OptimizerName::Adam, OptimizerName::Sgd]
            .into_iter()
            .find(|o| o.name() == name)
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
                let mut by_label: BTreeMap<&str, f64> = BTreeMap::new();
                for (k, &w) in m {
                    let Some(label) = labels
                        .iter()
                        .find(|l| *l == k)
                        .or_else(|| boolean_alias(labels, k))
                    else {
                        return Err(ParamError {
                            message: format!(
                                "class_weight names label \"{k}\", which does not occur in the label column"
                            ),
                            hint: Some(format!(
                                "the labels are: {}",
                                labels.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
                            )),
                        });
                    };
                    if by_label.insert(label, w).is_some() {
                        return Err(ParamError {
                            message: format!("class_weight names label \"{label}\" twice"),
                            hint: Some("Give each label one weight.".into()),
                        });
                    }
                }
                Ok(labels
                    .iter()
                    .map(|l| by_label.get(l.as_str()).copied().unwrap_or(1.0))
                    .collect())
            }
        }
    }
}

/// A boolean label's classes are named false and true, as predictions name them; "0" and "1"
/// (how class_weight named them before 0.5.0) name them too.
fn boolean_alias<'a>(labels: &'a [String], key: &str) -> Option<&'a String> {
    if labels != ["false", "true"] {
        return None;
    }
    match key {
        "0" => Some(&labels[0]),
        "1" => Some(&labels[1]),
        _ => None,
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

/// A stored model named by a param (`warm_start`): its id, or its name (the deployed version).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ModelKey {
    Id(i64),
    Name(String),
}

impl ModelKey {
    pub fn to_json(&self) -> Value {
        match self {
            ModelKey::Id(id) => json!(id),
            ModelKey::Name(name) => json!(name),
        }
    }
}

/// class_weight as written back by `TrainParams::to_json`.
pub(super) fn class_weight_json(class_weight: &Option<ClassWeight>) -> Value {
    match class_weight {
        None => Value::Null,
        Some(ClassWeight::Balanced) => json!("balanced"),
        Some(ClassWeight::Map(m)) => json!(m),
    }
}

/// validation as written back by `TrainParams::to_json`.
pub(super) fn validation_json(validation: &Option<Validation>) -> Value {
    match validation {
        None => Value::Null,
        Some(Validation::Fraction(f)) => json!({ "fraction": f }),
        Some(Validation::Relation(r)) => json!({ "relation": r }),
        Some(Validation::Predicate(p)) => json!({ "predicate": p }),
    }
}

/// A network's shape and optimizer, as the params give them.
impl super::TrainParams {
    /// The defaults of a model trained by gradients in batches (networks, factorization
    /// machines) where they differ from a linear model's (Adam at 0.001 or SGD with momentum 0.9
    /// at 0.01, a constant schedule, batches of 32, the last iterate), filled in for the keys
    /// not `given`; and what such a model cannot take. `kinds` names the kinds, for errors.
    pub(crate) fn gradient_defaults(
        &mut self,
        given: &dyn Fn(&str) -> bool,
        kinds: &str,
    ) -> Result<(), ParamError> {
        let optimizer = *self.optimizer.get_or_insert(OptimizerName::Adam);
        match (optimizer, self.momentum) {
            (OptimizerName::Adam, Some(_)) => {
                return Err(ParamError {
                    message: "\"momentum\" applies to \"optimizer\": \"sgd\" only".into(),
                    hint: Some("Adam keeps its own moving averages; set \"optimizer\": \"sgd\" to use momentum.".into()),
                })
            }
            (OptimizerName::Sgd, None) => self.momentum = Some(0.9),
            _ => {}
        }
        if !given("learning_rate") {
            self.learning_rate = match optimizer {
                OptimizerName::Adam => 0.001,
                OptimizerName::Sgd => 0.01,
            };
        }
        if !given("learning_rate_schedule") {
            self.learning_rate_schedule = ScheduleKind::Constant;
        }
        if !given("batch_size") {
            self.batch_size = 32;
        }
        if !given("average") {
            self.average = false;
        } else if self.average {
            return Err(ParamError {
                message: format!("\"average\" cannot be used with {kinds}"),
                hint: Some("An average of a network's weights along training is not a trained network: leave \"average\" out.".into()),
            });
        }
        if self.l1 != 0.0 {
            return Err(ParamError {
                message: format!("\"l1\" cannot be used with {kinds}"),
                hint: Some("Use \"l2\" to regularize a network's weights.".into()),
            });
        }
        Ok(())
    }

    /// A network's hidden widths (`[64]` unless given).
    pub fn network_hidden(&self) -> Vec<usize> {
        self.hidden
            .as_ref()
            .map_or(vec![64], |h| h.iter().map(|&w| w as usize).collect())
    }

    /// A network's optimizer (Adam unless given).
    pub fn network_optimizer(&self) -> OptimizerKind {
        match self.optimizer {
            Some(OptimizerName::Sgd) => OptimizerKind::Sgd {
                momentum: self.momentum.unwrap_or(0.9),
            },
            _ => OptimizerKind::Adam,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, f64)]) -> ClassWeight {
        ClassWeight::Map(pairs.iter().map(|(k, w)| (k.to_string(), *w)).collect())
    }

    fn names(labels: &[&str]) -> Vec<String> {
        labels.iter().map(|l| l.to_string()).collect()
    }

    #[test]
    fn a_boolean_label_is_weighted_by_false_and_true_or_0_and_1() {
        let labels = names(&["false", "true"]);
        let counts = [10, 10];
        assert_eq!(
            map(&[("true", 5.0)]).resolve(&labels, &counts).unwrap(),
            [1.0, 5.0]
        );
        assert_eq!(
            map(&[("1", 5.0)]).resolve(&labels, &counts).unwrap(),
            [1.0, 5.0]
        );
        assert_eq!(
            map(&[("0", 2.0)]).resolve(&labels, &counts).unwrap(),
            [2.0, 1.0]
        );
        let twice = map(&[("1", 5.0), ("true", 3.0)]).resolve(&labels, &counts);
        assert!(twice.unwrap_err().message.contains("twice"));
        let unknown = map(&[("yes", 5.0)]).resolve(&labels, &counts).unwrap_err();
        assert_eq!(unknown.hint.as_deref(), Some("the labels are: false, true"));
    }

    #[test]
    fn numbers_and_texts_are_named_as_they_are() {
        let counts = [10, 10];
        let numbers = names(&["0", "1"]);
        assert_eq!(
            map(&[("1", 5.0)]).resolve(&numbers, &counts).unwrap(),
            [1.0, 5.0]
        );
        // "true" is not a number's name.
        assert!(map(&[("true", 5.0)]).resolve(&numbers, &counts).is_err());
        let texts = names(&["no", "yes"]);
        assert!(map(&[("1", 5.0)]).resolve(&texts, &counts).is_err());
        assert_eq!(
            map(&[("yes", 4.0)]).resolve(&texts, &counts).unwrap(),
            [1.0, 4.0]
        );
    }
}
