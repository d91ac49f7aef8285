//! Hyperparameter search in one pass: the configurations a `search` param describes (a grid of
//! values per param, or a seeded sample of it with `search_trials`), and how the trained
//! configurations are ranked (`select_by`). The configurations train side by side on the same
//! shuffled buffers ([`crate::trials::Trials`]); this module only says which ones there are.

use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{ParamError, TrainParams, Validation};
use crate::capabilities::{refusal, used, Use};
use crate::model::ModelKind;
use crate::shuffle::bounded;
use serde_json::json;

/// The params a search may vary: those that change how a model learns, not what it reads
/// (features, label, validation) nor how the table is read (shuffle, sizes), which every
/// configuration shares because they share the scan.
pub const SEARCHABLE: &[&str] = &[
    "model",
    "learning_rate",
    "learning_rate_schedule",
    "decay",
    "l2",
    "l1",
    "batch_size",
    "average",
    "class_weight",
    "hidden",
    "activation",
    "optimizer",
    "momentum",
    "factors",
];

/// A configuration's model kind: its `"model"` value, or the training's `kind`.
pub fn configuration_kind(configuration: &Map<String, Value>, kind: ModelKind) -> ModelKind {
    configuration
        .get("model")
        .and_then(Value::as_str)
        .and_then(ModelKind::parse)
        .unwrap_or(kind)
}

/// The kinds a search may put beside `kind`: those that read the label as it does (two classes,
/// classes or a number), so that every configuration trains on the same rows and labels.
fn same_labels_kinds(kind: ModelKind) -> Vec<&'static str> {
    ModelKind::ALL
        .into_iter()
        .filter(|k| k.labels() == kind.labels())
        .map(|k| k.name())
        .collect()
}

/// Configurations of one search at most: each is a model in memory and a catalog row.
pub const MAX_TRIALS: usize = 256;

/// The keys of the search itself, left out of every configuration's params.
pub const SEARCH_KEYS: [&str; 3] = ["search", "search_trials", "select_by"];
/// The keys of per-group models (not listed in the params of a training without groups).
pub const GROUP_KEYS: [&str; 2] = ["group_by", "min_group_rows"];

/// A `search` param: for each searched key, the values to try (in the order given).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Search {
    /// Each searched key with its values, in key order.
    pub grid: Vec<(String, Vec<Value>)>,
    /// The user's other params, which every configuration shares (filled in by
    /// `TrainParams::for_kind`: a configuration is parsed from them plus its own values, so
    /// that defaults that depend on a searched value, e.g. the optimizer's learning rate,
    /// follow it).
    #[serde(default)]
    pub base: Map<String, Value>,
}

/// How the configurations are ranked: by their final model's score on the validation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SelectBy {
    Accuracy,
    R2,
    Loss,
    /// Two-class kinds (svm, logistic).
    F1,
    RocAuc,
    /// Kinds with probabilities (logistic, softmax, mlp).
    LogLoss,
}

impl SelectBy {
    pub fn parse(s: &str) -> Option<SelectBy> {
        match s {
            "accuracy" => Some(SelectBy::Accuracy),
            "r2" => Some(SelectBy::R2),
            "loss" => Some(SelectBy::Loss),
            "f1" => Some(SelectBy::F1),
            "roc_auc" => Some(SelectBy::RocAuc),
            "log_loss" => Some(SelectBy::LogLoss),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SelectBy::Accuracy => "accuracy",
            SelectBy::R2 => "r2",
            SelectBy::Loss => "loss",
            SelectBy::F1 => "f1",
            SelectBy::RocAuc => "roc_auc",
            SelectBy::LogLoss => "log_loss",
        }
    }

    /// The score of a model's validation statistics this ranks by (None: the rows gave none,
    /// e.g. ROC AUC without both classes, or no validation row).
    pub fn score(self, v: &crate::scoring::ValidationStats) -> Option<f64> {
        if v.rows == 0 {
            return None;
        }
        match self {
            SelectBy::Accuracy => v.accuracy,
            SelectBy::R2 => v.r2,
            SelectBy::Loss => Some(v.loss),
            SelectBy::F1 => v.f1,
            SelectBy::RocAuc => v.roc_auc,
            SelectBy::LogLoss => v.log_loss,
        }
    }

    /// Why this score cannot rank models of `kind`, if it cannot.
    fn refused_for(self, kind: ModelKind) -> Option<(&'static str, &'static str)> {
        let classifier = "A classifier's configurations are ranked by \"accuracy\" or \"loss\" (two classes: also \"f1\", \"roc_auc\"; with probabilities: \"log_loss\").";
        let regression = "A regression's configurations are ranked by \"r2\" or \"loss\".";
        match self {
            SelectBy::Accuracy if !kind.is_classifier() => {
                Some(("\"select_by\": \"accuracy\" is for classifiers", regression))
            }
            SelectBy::R2 if kind.is_classifier() => {
                Some(("\"select_by\": \"r2\" is for regression", classifier))
            }
            SelectBy::F1 | SelectBy::RocAuc if !kind.is_binary() => Some((
                "\"select_by\": \"f1\" and \"roc_auc\" are for two-class kinds (svm, logistic)",
                if kind.is_classifier() { classifier } else { regression },
            )),
            SelectBy::LogLoss if !(kind.is_classifier() && kind.has_proba()) => Some((
                "\"select_by\": \"log_loss\" is for classifiers with probabilities (logistic, softmax, mlp)",
                if kind.is_classifier() { classifier } else { regression },
            )),
            _ => None,
        }
    }

    /// Whether `a` is a better score than `b` (loss: lower; accuracy, R²: higher). A NaN score
    /// is never better.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            SelectBy::Loss | SelectBy::LogLoss => a < b,
            _ => a > b,
        }
    }
}

/// The index of the best of `scores` (None: a configuration without a score, e.g. diverged);
/// ties go to the first.
pub fn best_of(select_by: SelectBy, scores: &[Option<f64>]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, s) in scores.iter().enumerate() {
        let Some(s) = s.filter(|s| s.is_finite()) else {
            continue;
        };
        if best.is_none_or(|(_, b)| select_by.better(s, b)) {
            best = Some((i, s));
        }
    }
    best.map(|(i, _)| i)
}

fn search_error(message: String, hint: &str) -> ParamError {
    ParamError {
        message,
        hint: Some(hint.to_string()),
    }
}

const SEARCH_HINT: &str = "search must be an object mapping params to non-empty arrays of values, e.g. {\"learning_rate\": [0.001, 0.01], \"l2\": [0, 0.0001]}";

impl Search {
    /// Reads the `search` param's shape (each value is checked as its param later, see
    /// `TrainParams::for_kind`).
    pub fn parse(key: &str, v: &Value) -> Result<Search, ParamError> {
        let obj = v.as_object().ok_or_else(|| {
            search_error(
                format!("invalid value for parameter \"{key}\": expected an object"),
                SEARCH_HINT,
            )
        })?;
        if obj.is_empty() {
            return Err(search_error(
                format!("parameter \"{key}\" names no param to search"),
                SEARCH_HINT,
            ));
        }
        let mut grid = Vec::with_capacity(obj.len());
        for (param, values) in obj {
            if !SEARCHABLE.contains(&param.as_str()) {
                return Err(search_error(
                    format!("\"{param}\" cannot be searched"),
                    &format!(
                        "A search varies how the models learn, over one shared scan: it can vary {}.",
                        SEARCHABLE.join(", ")
                    ),
                ));
            }
            let values = match values {
                Value::Array(a) if !a.is_empty() => a,
                _ => {
                    return Err(search_error(
                        format!("\"search\": \"{param}\" must be a non-empty array of values"),
                        SEARCH_HINT,
                    ))
                }
            };
            if values.len() > MAX_TRIALS {
                return Err(search_error(
                    format!(
                        "\"search\": \"{param}\" has {} values, more than {MAX_TRIALS}",
                        values.len()
                    ),
                    "A search trains every configuration side by side: try fewer values.",
                ));
            }
            grid.push((param.clone(), values.clone()));
        }
        let search = Search {
            grid,
            base: Map::new(),
        };
        if search.grid_size() > MAX_TRIALS as u128 {
            return Err(search_error(
                format!(
                    "\"search\" describes {} configurations, more than {MAX_TRIALS}",
                    search.grid_size()
                ),
                &format!("Try fewer values, or sample the grid with \"search_trials\" (at most {MAX_TRIALS})."),
            ));
        }
        Ok(search)
    }

    /// The kinds a search of `kind` trains: `kind`, and those its `"model"` values name.
    pub fn kinds(&self, kind: ModelKind) -> Vec<ModelKind> {
        let mut kinds = vec![kind];
        for (key, values) in &self.grid {
            if key == "model" {
                kinds.extend(
                    values
                        .iter()
                        .filter_map(Value::as_str)
                        .filter_map(ModelKind::parse),
                );
            }
        }
        kinds
    }

    /// How many configurations the grid has (the product of the value counts).
    pub fn grid_size(&self) -> u128 {
        self.grid
            .iter()
            .fold(1u128, |n, (_, v)| n.saturating_mul(v.len() as u128))
    }

    /// The configurations to train: every combination of the grid (the first key's values
    /// change slowest), or with `trials` a sample of that many drawn without replacement
    /// from `seed` (kept in grid order). Each is the searched keys with their values.
    pub fn configurations(&self, trials: Option<u32>, seed: u64) -> Vec<Map<String, Value>> {
        let n = self.grid_size() as usize; // at most MAX_TRIALS (checked in parse)
        let mut chosen: Vec<usize> = (0..n).collect();
        if let Some(k) = trials.map(|k| k as usize).filter(|&k| k < n) {
            // A partial Fisher–Yates: the first k positions are a uniform sample.
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5EA2_C4ED_0000_0001);
            for i in 0..k {
                let j = i + bounded(&mut rng, (n - i) as u64) as usize;
                chosen.swap(i, j);
            }
            chosen.truncate(k);
            chosen.sort_unstable();
        }
        chosen.into_iter().map(|i| self.configuration(i)).collect()
    }

    /// The `index`-th combination of the grid (mixed radix, the last key fastest).
    fn configuration(&self, mut index: usize) -> Map<String, Value> {
        let mut picks = vec![0; self.grid.len()];
        for (pick, (_, values)) in picks.iter_mut().zip(&self.grid).rev() {
            *pick = index % values.len();
            index /= values.len();
        }
        self.grid
            .iter()
            .zip(picks)
            .map(|((key, values), pick)| (key.clone(), values[pick].clone()))
            .collect()
    }

    /// The params of one configuration: the shared ones with its own values.
    pub fn params_of(&self, configuration: &Map<String, Value>) -> Value {
        let mut params = self.base.clone();
        for (k, v) in configuration {
            params.insert(k.clone(), v.clone());
        }
        Value::Object(params)
    }

    /// The `search` param as the user wrote it (an object of arrays).
    pub fn to_json(&self) -> Value {
        Value::Object(
            self.grid
                .iter()
                .map(|(k, v)| (k.clone(), Value::Array(v.clone())))
                .collect(),
        )
    }
}

/// One configuration of a training: the values a search chose (none without a search) and the
/// params it trains with.
pub type Configuration = (Map<String, Value>, TrainParams);

/// The search and cross-validation params of a training: their checks, and what trains side by
/// side.
impl TrainParams {
    /// What cross-validation cannot be combined with, refused before any work.
    pub(super) fn check_folds(&self) -> Result<(), ParamError> {
        if self.folds.is_none() {
            return Ok(());
        }
        let refuse = |message: &str, hint: &str| {
            Err(ParamError {
                message: message.into(),
                hint: Some(hint.into()),
            })
        };
        if self.validation.is_some() {
            return refuse(
                "\"folds\" cannot be used with \"validation\"",
                "Cross-validation holds out every row once, fold by fold: leave \"validation\" out.",
            );
        }
        if self.tolerance > 0.0 {
            return refuse(
                "\"folds\" cannot be used with \"tolerance\"",
                "Every fold's model trains every epoch: leave \"tolerance\" out.",
            );
        }
        Ok(())
    }

    /// What per-group models need and cannot be combined with yet, refused before any work;
    /// fills in `min_group_rows`.
    pub(super) fn check_groups(&mut self) -> Result<(), ParamError> {
        let refuse = |message: &str, hint: &str| {
            Err(ParamError {
                message: message.into(),
                hint: Some(hint.into()),
            })
        };
        if self.group_by.is_none() {
            if self.min_group_rows.is_some() {
                return refuse(
                    "\"min_group_rows\" needs \"group_by\"",
                    "Add e.g. \"group_by\": \"store_id\".",
                );
            }
            return Ok(());
        }
        self.min_group_rows
            .get_or_insert(super::DEFAULT_MIN_GROUP_ROWS);
        if self.name.is_none() {
            return refuse(
                "\"group_by\" needs \"name\"",
                "Every group's model is stored as a version of the name, the model of every row last: add e.g. \"name\": \"my_model\".",
            );
        }
        let uses = used(&[
            (Use::Search, self.search.is_some()),
            (Use::Folds, self.folds.is_some()),
            (Use::Validation, self.validation.is_some()),
            (Use::Tolerance, self.tolerance > 0.0),
        ]);
        match refusal(Use::GroupBy, &uses) {
            Some(r) => Err(ParamError::refused(r)),
            None => Ok(()),
        }
    }

    /// A search's own checks (see [`Search`]): the configurations share the training's other
    /// params (validation defaults to a 20% hash split), each value of the grid is checked as
    /// its param on them, and what a search cannot do is refused before any work.
    pub(super) fn check_search(
        &mut self,
        value: &Value,
        kind: ModelKind,
    ) -> Result<(), ParamError> {
        let refuse = |message: &str, hint: &str| {
            Err(ParamError {
                message: message.into(),
                hint: Some(hint.into()),
            })
        };
        let Some(search) = &mut self.search else {
            if self.search_trials.is_some() || self.select_by.is_some() {
                return refuse(
                    "\"search_trials\" and \"select_by\" need \"search\"",
                    "Add e.g. \"search\": {\"learning_rate\": [0.001, 0.01, 0.1]}.",
                );
            }
            return Ok(());
        };
        if self.name.is_none() {
            return refuse(
                "\"search\" needs \"name\"",
                "Every configuration is stored as a version of the name, the best one last: add e.g. \"name\": \"my_model\".",
            );
        }
        if self.tolerance > 0.0 {
            return refuse(
                "\"search\" cannot be used with \"tolerance\"",
                "Every configuration trains every epoch; to stop on the validation loss, use \"patience\".",
            );
        }
        let mut base: Map<String, Value> = value
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !SEARCH_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if self.validation.is_none() && self.folds.is_none() {
            base.insert("validation".into(), json!({"fraction": 0.2}));
            self.validation = Some(Validation::Fraction(0.2));
        }
        // Each value alone on the shared params: its errors name the value. A model kind must
        // read the label as the training's kind does.
        let mut kinds = vec![kind];
        for (key, values) in &search.grid {
            for v in values {
                if key == "model" {
                    let allowed = same_labels_kinds(kind);
                    let named = v.as_str().and_then(ModelKind::parse);
                    match named.filter(|k| allowed.contains(&k.name())) {
                        Some(k) => kinds.push(k),
                        None => {
                            return refuse(
                                &format!("in \"search\": \"model\" cannot be {v} in a training of {}", kind.name()),
                                &format!("The configurations share the rows and their labels: a {} training can search the kinds {}.", kind.name(), allowed.join(", ")),
                            )
                        }
                    }
                    continue;
                }
                let mut one = base.clone();
                one.insert(key.clone(), v.clone());
                TrainParams::for_kind(&Value::Object(one), kind).map_err(|e| ParamError {
                    message: format!("in \"search\": {}", e.message),
                    hint: e.hint,
                })?;
            }
        }
        search.base = base;
        let refused = kinds
            .into_iter()
            .find_map(|k| self.select_by.and_then(|s| s.refused_for(k)));
        match refused {
            Some((message, hint)) => refuse(message, hint),
            None => Ok(()),
        }
    }

    /// With `search`: what ranks the configurations (accuracy for classifiers, R² for
    /// regression, unless `select_by` says otherwise).
    pub fn selection(&self, kind: ModelKind) -> SelectBy {
        self.select_by.unwrap_or(if kind.is_classifier() {
            SelectBy::Accuracy
        } else {
            SelectBy::R2
        })
    }

    /// How many models train side by side: per configuration, one on all rows and, with
    /// `folds`, one per fold.
    pub fn n_models(&self) -> usize {
        self.n_configurations() * (1 + self.folds.unwrap_or(0) as usize)
    }

    /// How many configurations train side by side: a search's, else one.
    pub fn n_configurations(&self) -> usize {
        match &self.search {
            None => 1,
            Some(s) => {
                let grid = s.grid_size() as usize; // at most MAX_TRIALS
                self.search_trials.map_or(grid, |k| grid.min(k as usize))
            }
        }
    }

    /// What trains side by side: without `search`, these params alone; with it, every
    /// configuration (its searched values and its params, the seed included).
    pub fn configurations(&self, kind: ModelKind) -> Result<Vec<Configuration>, ParamError> {
        let Some(search) = &self.search else {
            return Ok(vec![(Map::new(), self.clone())]);
        };
        let seed = self.seed.unwrap_or(0);
        search
            .configurations(self.search_trials, seed)
            .into_iter()
            .map(|c| {
                let mut params = search.params_of(&c);
                params["seed"] = json!(seed);
                // A searched kind is the configuration's kind, not one of its params.
                let own_kind = configuration_kind(&c, kind);
                if let Some(p) = params.as_object_mut() {
                    p.remove("model");
                }
                let p = TrainParams::for_kind(&params, own_kind).map_err(|e| ParamError {
                    message: format!(
                        "in the search configuration {}: {}",
                        Value::Object(c.clone()),
                        e.message
                    ),
                    hint: e.hint,
                })?;
                Ok((c, p))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn search(v: Value) -> Search {
        Search::parse("search", &v).unwrap()
    }

    #[test]
    fn the_grid_is_every_combination_in_order() {
        let s = search(json!({"learning_rate": [0.1, 0.01], "l2": [0, 1, 2]}));
        assert_eq!(s.grid_size(), 6);
        let c = s.configurations(None, 7);
        let pairs: Vec<(f64, f64)> = c
            .iter()
            .map(|m| {
                (
                    m["l2"].as_f64().unwrap(),
                    m["learning_rate"].as_f64().unwrap(),
                )
            })
            .collect();
        // serde_json's map is ordered by key: "l2" is the first key, so it changes slowest.
        assert_eq!(
            pairs,
            vec![
                (0., 0.1),
                (0., 0.01),
                (1., 0.1),
                (1., 0.01),
                (2., 0.1),
                (2., 0.01)
            ]
        );
    }

    #[test]
    fn a_sample_is_distinct_seeded_and_of_the_size_asked() {
        let s = search(json!({"learning_rate": [1, 2, 3, 4, 5], "l2": [0, 1, 2, 3]}));
        let a = s.configurations(Some(6), 1);
        assert_eq!(a.len(), 6);
        let mut seen = a.clone();
        seen.dedup();
        assert_eq!(seen.len(), 6, "no configuration twice: {a:?}");
        assert_eq!(a, s.configurations(Some(6), 1), "same seed, same sample");
        let others: Vec<_> = (2..20)
            .map(|seed| s.configurations(Some(6), seed))
            .collect();
        assert!(
            others.iter().any(|o| o != &a),
            "other seeds draw other samples"
        );
        // Asking for as many or more than the grid has: the whole grid.
        assert_eq!(s.configurations(Some(20), 1), s.configurations(None, 1));
        assert_eq!(s.configurations(Some(99), 1).len(), 20);
    }

    #[test]
    fn every_configuration_is_drawn_about_equally_often() {
        let s = search(json!({"l2": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}));
        let mut counts = [0u32; 10];
        for seed in 0..2000 {
            for c in s.configurations(Some(3), seed) {
                counts[c["l2"].as_u64().unwrap() as usize] += 1;
            }
        }
        // 600 expected each; 5 standard deviations is about ±100.
        assert!(
            counts.iter().all(|&n| (500..700).contains(&n)),
            "{counts:?}"
        );
    }

    #[test]
    fn refused_shapes() {
        let err = |v: Value| Search::parse("search", &v).unwrap_err().message;
        assert!(err(json!([1])).contains("expected an object"));
        assert!(err(json!({})).contains("names no param"));
        assert!(err(json!({"epochs": [1, 2]})).contains("\"epochs\" cannot be searched"));
        assert!(err(json!({"l2": []})).contains("non-empty array"));
        assert!(err(json!({"l2": 0.1})).contains("non-empty array"));
        let big = json!({"l2": (0..20).collect::<Vec<_>>(), "l1": (0..20).collect::<Vec<_>>()});
        assert!(err(big).contains("400 configurations, more than 256"));
    }

    #[test]
    fn params_of_a_configuration_override_the_shared_ones() {
        let mut s = search(json!({"l2": [0.5]}));
        s.base = json!({"l2": 0, "epochs": 3}).as_object().unwrap().clone();
        let c = &s.configurations(None, 0)[0];
        assert_eq!(s.params_of(c), json!({"l2": 0.5, "epochs": 3}));
        assert_eq!(s.to_json(), json!({"l2": [0.5]}));
    }

    #[test]
    fn the_best_score_by_each_rule() {
        let scores = [
            Some(0.5),
            None,
            Some(f64::NAN),
            Some(0.9),
            Some(0.9),
            Some(0.1),
        ];
        assert_eq!(best_of(SelectBy::Accuracy, &scores), Some(3));
        assert_eq!(best_of(SelectBy::Loss, &scores), Some(5));
        assert_eq!(best_of(SelectBy::R2, &[None, Some(f64::NAN)]), None);
    }
}
