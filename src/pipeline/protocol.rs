//! What a coordinator and a shard server send each other: a round's request (statistics, a
//! round of training, or an evaluation) and the shard's reply, as JSON, and the checks each side
//! makes of what it receives. `crate::shard` sends the requests; on a shard server the SGD
//! node answers them (`exec::sgd::shard_round`).

use crate::pipeline::ClassValue;
use crate::pipeline::LearnedStatistics;
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::scoring::{EvaluationPart, TableSpec};
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trained::ModelParts;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Phase {
    Statistics,
    Train,
    Evaluate,
}

fn class_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<ClassValue>, D::Error> {
    corgipile_ml::wire::seq_at_most(d, corgipile_ml::trainer::MAX_CLASSES)
}

/// The stored model an evaluation scores (`Phase::Evaluate`).
#[derive(Clone, Serialize, Deserialize)]
pub struct EvaluateRequest {
    /// Shapes checked when it is built (`ModelParts::into_model`).
    pub model: ModelParts,
    /// The label values by class index, as stored with the model (at most MAX_CLASSES: a
    /// class value takes far more memory than its text, so the list is bounded as it is read).
    #[serde(deserialize_with = "class_list")]
    pub classes: Vec<ClassValue>,
    /// A column list's preprocessing, as stored with the model.
    pub preprocessing: Option<Preprocessor>,
    /// The evaluation tables to fill too (corgipile_roc_curve and the like).
    #[serde(default)]
    pub tables: Option<TableSpec>,
}

/// What the coordinator asks of a shard.
#[derive(Clone, Serialize, Deserialize)]
pub struct RoundRequest {
    /// The coordinator's corgipile version: a shard of another version refuses.
    pub version: String,
    pub phase: Phase,
    pub epoch: u32,
    /// This round is blocks `round`, `round + rounds`, … of the epoch's order.
    pub round: u32,
    pub rounds: u32,
    pub n_features: usize,
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    pub extras: LearnedStatistics,
    /// Evaluate: the model to score.
    #[serde(default)]
    pub evaluate: Option<EvaluateRequest>,
    /// Train a network: `weights` holds all its parameters (layer by layer, each layer's
    /// weights then biases) and `bias` nothing.
    #[serde(default)]
    pub network: Option<NetworkRound>,
}

/// What a shard needs to train a network beyond its params (which give the hidden layers,
/// activation and optimizer): which training it is, the output layer's classes in the
/// coordinator's numbering (empty for `mlp_regression`) and the regression target's
/// standardization.
#[derive(Clone, Serialize, Deserialize)]
pub struct NetworkRound {
    /// This training, among the coordinator backend's: a shard resumes the optimizer state
    /// of its last round of the same training (see `exec::sgd::shard_round`).
    pub training: u64,
    #[serde(deserialize_with = "class_list")]
    pub classes: Vec<ClassValue>,
    pub target_mean: f64,
    pub target_scale: f64,
}

/// What a shard answers.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct RoundReply {
    pub rows: u64,
    pub rows_skipped: u64,
    /// Statistics: the shard's, and its dense rows' width (None: no rows or sparse).
    pub stats: Option<FeatureStats>,
    pub width: Option<usize>,
    /// Train: the model after the round, and the round's progressive metrics.
    pub weights: Vec<f64>,
    pub bias: Vec<f64>,
    pub tuples: u64,
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub r2: Option<f64>,
    /// Evaluate: the shard's metrics, to merge.
    #[serde(default)]
    pub evaluation: Option<EvaluationPart>,
}

/// Every float finite.
fn all_finite(values: &[f64]) -> bool {
    values.iter().all(|v| v.is_finite())
}

impl LearnedStatistics {
    /// Why these (from a coordinator) cannot be trained with for `n_features` features and
    /// `classes` weighted classes (2 for the binary kinds).
    fn check(&self, n_features: usize, classes: usize) -> Result<(), String> {
        if let Some(s) = &self.standardizer {
            if s.mean.len() != n_features || s.scale.len() != n_features {
                return Err(format!(
                    "a standardizer of {}/{} features for a model of {n_features}",
                    s.mean.len(),
                    s.scale.len()
                ));
            }
            if !all_finite(&s.mean) || !s.scale.iter().all(|v| v.is_finite() && *v > 0.0) {
                return Err("a standardizer with values that are not finite".into());
            }
        }
        if let Some(w) = &self.class_weights {
            if w.len() != classes || !w.iter().all(|v| v.is_finite() && *v > 0.0) {
                return Err(format!(
                    "class weights other than {classes} positive numbers"
                ));
            }
        }
        if let Some((neg, pos)) = self.label_values {
            if !neg.is_finite() || !pos.is_finite() || neg == pos {
                return Err("label values that are not two distinct numbers".into());
            }
        }
        Ok(())
    }
}

impl RoundRequest {
    /// Why this request cannot be run for a model of `outputs` outputs: shapes that do not
    /// match, values that are not finite. Whoever calls corgipile_shard_round may have
    /// written it, so nothing in it is trusted. (Its size was bounded when it was parsed, and
    /// `n_features` is checked against corgipile.max_model_memory by the caller.)
    pub fn check(&self, outputs: usize) -> Result<(), String> {
        if self.rounds == 0 || self.round >= self.rounds || self.epoch == 0 {
            return Err(format!(
                "round {} of {} in epoch {}",
                self.round, self.rounds, self.epoch
            ));
        }
        if let Some(n) = &self.network {
            // The network's shape follows from the shard's params: checked there.
            if self.phase != Phase::Train
                || self.evaluate.is_some()
                || self.n_features == 0
                || !self.bias.is_empty()
                || !n.target_mean.is_finite()
                || !(n.target_scale.is_finite() && n.target_scale > 0.0)
            {
                return Err("a network round of another shape than a coordinator sends".into());
            }
            if !all_finite(&self.weights) {
                return Err("weights that are not finite".into());
            }
            return self.extras.check(self.n_features, n.classes.len());
        }
        if self.phase == Phase::Train {
            let weights = self.n_features.checked_mul(outputs);
            if self.n_features == 0
                || weights != Some(self.weights.len())
                || self.bias.len() != outputs
            {
                return Err(format!(
                    "a model of {} weights and {} biases for {} features",
                    self.weights.len(),
                    self.bias.len(),
                    self.n_features
                ));
            }
            if !all_finite(&self.weights) || !all_finite(&self.bias) {
                return Err("weights that are not finite".into());
            }
            self.extras.check(self.n_features, 2)?;
            // A linear sharded training is binary or a regression: class weights weigh the
            // binary label values, which must come with them.
            if self.extras.class_weights.is_some() && self.extras.label_values.is_none() {
                return Err("class weights without the label values they weigh".into());
            }
        }
        if (self.phase == Phase::Evaluate) != self.evaluate.is_some() {
            return Err("a model to evaluate in another phase, or none to evaluate".into());
        }
        if let Some(e) = &self.evaluate {
            if e.preprocessing.as_ref().is_some_and(|p| !p.is_sound()) {
                return Err("a preprocessing whose columns do not tile its features".into());
            }
        }
        Ok(())
    }
}

impl RoundReply {
    /// Why this reply (from a shard server: maybe from code its role wrote) does not answer
    /// `request`: another shape than asked for, values that are not finite, impossible
    /// counts. Sizes were bounded when it was parsed.
    pub fn check(&self, request: &RoundRequest) -> Result<(), String> {
        // More rows than one PostgreSQL table can hold (2^32 pages of at most 291 tuples).
        const MAX_ROWS: u64 = 1 << 41;
        if self.rows > MAX_ROWS || self.rows_skipped > MAX_ROWS {
            return Err(format!(
                "{} rows and {} skipped rows",
                self.rows, self.rows_skipped
            ));
        }
        match request.phase {
            Phase::Statistics => {
                if let Some(stats) = &self.stats {
                    stats.check()?;
                    if stats.rows() != self.rows {
                        return Err("statistics of another number of rows".into());
                    }
                    if self.width.is_some_and(|w| w != stats.n_features()) {
                        return Err("a row width other than its statistics'".into());
                    }
                } else if self.rows > 0 || self.width.is_some() {
                    return Err("rows without statistics".into());
                }
                if !self.weights.is_empty() || !self.bias.is_empty() || self.evaluation.is_some() {
                    return Err("a model or metrics where statistics were asked for".into());
                }
            }
            Phase::Train => {
                if self.weights.len() != request.weights.len()
                    || self.bias.len() != request.bias.len()
                {
                    return Err(format!(
                        "a model of {} weights and {} biases, where {} and {} were sent",
                        self.weights.len(),
                        self.bias.len(),
                        request.weights.len(),
                        request.bias.len()
                    ));
                }
                if !all_finite(&self.weights) || !all_finite(&self.bias) {
                    return Err("weights that are not finite".into());
                }
                let metric_ok = |m: Option<f64>, lo: f64, hi: f64| {
                    m.is_none_or(|v| v.is_finite() && (lo..=hi).contains(&v))
                };
                if !self.loss.is_finite()
                    || self.loss < 0.0
                    || self.tuples > self.rows
                    || !metric_ok(self.accuracy, 0.0, 1.0)
                    || !metric_ok(self.r2, f64::NEG_INFINITY, 1.0)
                {
                    return Err("impossible loss, metrics or tuple counts".into());
                }
                if self.stats.is_some() || self.width.is_some() || self.evaluation.is_some() {
                    return Err("statistics or metrics where a model was asked for".into());
                }
            }
            Phase::Evaluate => {
                let Some(part) = &self.evaluation else {
                    return Err("no evaluation".into());
                };
                if let Some(model) = &request.evaluate {
                    part.check(model.model.kind(), model.classes.len(), model.tables)?;
                }
            }
        }
        Ok(())
    }
}
