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

/// When a training stops on its validation loss (`"patience"`), keeping its best epoch's model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Patience {
    /// After this many epochs without a lower validation loss.
    Epochs(u32),
    /// `"auto"`, the default of networks and factorization machines: after about
    /// [`AUTO_PATIENCE_ROWS`] training rows (2 to 10 epochs: as scikit-learn's 10 on a small
    /// table, 2 on a big one, which need not pay many passes once it has converged) without a
    /// validation loss lower than the best by [`AUTO_MIN_IMPROVEMENT`] of it.
    Auto,
}

/// The training rows `"patience": "auto"` waits for a better validation loss.
pub const AUTO_PATIENCE_ROWS: u64 = 600_000;
/// The least relative improvement of the validation loss `"patience": "auto"` counts.
pub const AUTO_MIN_IMPROVEMENT: f64 = 1e-4;
/// The epochs a network or a machine trains at most when it stops on its own (the default).
pub const AUTO_MAX_EPOCHS: u32 = 200;
/// The share of rows held out for early stopping by default (as scikit-learn's 10%).
pub const AUTO_VALIDATION_FRACTION: f64 = 0.1;

impl Patience {
    /// The epochs without improvement after which a training of `rows` rows an epoch stops.
    pub fn epochs(self, rows: u64) -> u32 {
        match self {
            Patience::Epochs(n) => n,
            Patience::Auto => AUTO_PATIENCE_ROWS.div_ceil(rows.max(1)).clamp(2, 10) as u32,
        }
    }

    /// Whether a validation `loss` is an improvement on the `best` so far.
    pub fn improves(self, loss: f64, best: f64) -> bool {
        match self {
            Patience::Epochs(_) => loss < best,
            Patience::Auto => loss < best - AUTO_MIN_IMPROVEMENT * best.abs(),
        }
    }

    pub fn to_json(self) -> Value {
        match self {
            Patience::Epochs(n) => json!(n),
            Patience::Auto => json!("auto"),
        }
    }
}

/// `"deploy"`: how the version a training stores becomes the one its name means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeployRule {
    /// `"if_better"`: the new version and the deployed one are scored on the training's
    /// held-out rows; the new one is deployed only if it scores more than `margin` higher.
    IfBetter,
}

impl DeployRule {
    pub fn name(self) -> &'static str {
        match self {
            DeployRule::IfBetter => "if_better",
        }
    }

    pub fn parse(name: &str) -> Option<DeployRule> {
        (name == "if_better").then_some(DeployRule::IfBetter)
    }
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
        if self.stops_early_by_default(given) {
            self.epochs = AUTO_MAX_EPOCHS;
            self.validation = Some(Validation::Fraction(AUTO_VALIDATION_FRACTION));
            self.patience = Some(Patience::Auto);
        }
        Ok(())
    }

    /// Whether a model trained by gradients in batches holds out rows and stops on them by
    /// default (scikit-learn's early stopping: a fixed number of epochs undertrains a table of
    /// many classes and few columns, and overpays on a big one): unless the call says how long
    /// to train or what to validate on, or trains several models that share no held-out rows.
    pub(crate) fn stops_early_by_default(&self, given: &dyn Fn(&str) -> bool) -> bool {
        const SAYS_OTHERWISE: [&str; 9] = [
            "epochs",
            "validation",
            "patience",
            "tolerance",
            "search",
            "folds",
            "group_by",
            "warm_start",
            "since",
        ];
        !SAYS_OTHERWISE.iter().any(|key| given(key))
    }

    /// A fixed number of epochs without held-out rows again, where stopping early by default
    /// cannot run (a sharded table: its shards take no validation rows yet).
    pub fn without_early_stopping(&mut self) {
        self.epochs = Self::defaults().epochs;
        self.validation = None;
        self.patience = None;
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

#[cfg(test)]
mod stopping_tests {
    use super::*;
    use crate::model::ModelKind;
    use crate::params::TrainParams;
    use serde_json::json;

    fn params(kind: ModelKind, given: Value) -> TrainParams {
        TrainParams::for_kind(&given, kind).expect("valid params")
    }

    #[test]
    fn networks_and_machines_stop_early_unless_told_how_long_to_train() {
        for kind in [
            ModelKind::Mlp,
            ModelKind::MlpRegression,
            ModelKind::Fm,
            ModelKind::FmRegression,
        ] {
            let p = params(kind, json!({}));
            assert_eq!(p.epochs, AUTO_MAX_EPOCHS, "{kind:?}");
            assert_eq!(p.validation, Some(Validation::Fraction(0.1)), "{kind:?}");
            assert_eq!(p.patience, Some(Patience::Auto), "{kind:?}");
            assert_eq!(p.to_json()["patience"], json!("auto"));
            // Saying how long to train, or what to validate on, or training many models
            // that share no held-out rows, keeps what was said.
            for given in [
                json!({"epochs": 20}),
                json!({"validation": {"fraction": 0.2}}),
                json!({"validation": {"fraction": 0.2}, "patience": 3}),
                json!({"folds": 3}),
                json!({"search": {"learning_rate": [0.001, 0.01]}, "name": "s"}),
            ] {
                let p = params(kind, given.clone());
                assert_ne!(p.patience, Some(Patience::Auto), "{kind:?} {given}");
                assert!(p.epochs != AUTO_MAX_EPOCHS, "{kind:?} {given}");
            }
        }
        let p = params(ModelKind::Logistic, json!({}));
        assert_eq!((p.epochs, p.validation, p.patience), (20, None, None));
        // "auto" may be asked for, with validation.
        let p = params(
            ModelKind::Logistic,
            json!({"validation": {"fraction": 0.1}, "patience": "auto", "epochs": 50}),
        );
        assert_eq!(p.patience, Some(Patience::Auto));
        let mut p = params(ModelKind::Mlp, json!({}));
        p.without_early_stopping();
        assert_eq!((p.epochs, p.validation, p.patience), (20, None, None));
    }
}
