//! What a coordinator and a shard server send each other: a round's request (statistics, a
//! round of training, or an evaluation) and the shard's reply, as JSON, and the checks each side
//! makes of what it receives. `crate::shard` sends the requests; on a shard server the SGD
//! node answers them (`exec::sgd::shard_round`).
//!
//! Both messages carry the sender's corgipile version and [`PROTOCOL`]: a shard refuses a
//! request of another version before it reads the rest of it (`Versions`), and the coordinator
//! a reply of another version before it uses it, so that servers of different versions give an
//! ERROR naming both versions, never a model trained by two readings of one message.

use super::protocol_parts::{FamilyModels, ImportanceAsk, ImportancePart, InferenceAsk};
use crate::pipeline::mark::{check_marks, TableMark};
use crate::pipeline::ClassValue;
use crate::pipeline::LearnedStatistics;
use corgipile_ml::importance::{column_ranges, Metric};
use corgipile_ml::inference::InformationPart;
use corgipile_ml::model::ModelKind;
use corgipile_ml::preprocess::{Preprocessor, StatsPart};
use corgipile_ml::scoring::{EvaluationPart, TableSpec};
use corgipile_ml::stats::FeatureStats;
use corgipile_ml::trained::ModelParts;
use serde::{Deserialize, Serialize};

mod classes;
mod groups;
mod learners;
use classes::class_list;
pub use classes::{check_classes, merge_classes, merged_index};
pub use groups::{GroupKey, GroupRows};
pub use learners::{LearnerReply, LearnerRound};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Phase {
    Statistics,
    Train,
    Evaluate,
    /// Score the coordinator's model of the epoch (in `evaluate`, as an evaluation's) on the
    /// validation rows this shard held out of the training's first epoch.
    Validate,
    /// corgipile_feature_importance: count this shard's rows, or score the coordinator's model
    /// (in `evaluate`) on a sample of them with each column permuted (`importance`; see
    /// `shard::importance`).
    Importance,
    /// `"inference"`: a Newton pass over every row of the shard at the coordinator's
    /// coefficients (`inference`), its sums sent back to be merged (see
    /// `shard::training::inference`).
    Inference,
}

/// The shard protocol's version: bumped whenever a message's fields or their meaning change
/// (1: 0.5.0; 2: the statistics round's class lists and the coordinator's numbering of them;
/// 3: the training's number in every request, validation rounds; 4: column lists — the
/// statistics round's parts of the preprocessing, the merged preprocessing in every training
/// round, the coordinator's time zone; 5: learners — a training round carries every learner
/// of the training (a search's configurations, folds) with its parameters, and the reply each
/// one's parameters, statistics and validation score, see `protocol::learners`; a warm start's
/// stored preprocessing in the statistics round; importance rounds; per-group evaluations; the
/// statistics round's table marks and a `"since"` training's marks in its requests; 6: a gated
/// training's held-out rows — training rounds that keep their tuple ids, an evaluation of only
/// those rows; 7: `"inference"` — Newton pass rounds and each shard's information part; 8:
/// per-group models — the statistics round's groups and rows, a training round's numbered
/// groups and each learner's group, see `protocol::groups` — and a network's or factorization
/// machine's drift correction in a training round, with each shard's control in its reply; 9:
/// a training round's network learners — a search's, folds — each keep their own optimizer
/// state on the shard between rounds, and may differ in shape).
/// Two servers of the same corgipile version speak the same protocol, but development builds
/// of one version may not: both are checked.
pub const PROTOCOL: u32 = 9;

/// Longest label text (in bytes) a sharded training numbers: the statistics round sends every
/// shard's class names, and a class name is a label, not a document.
pub const MAX_CLASS_TEXT: usize = 4096;

/// Longest time zone name a coordinator sends (PostgreSQL's own are under 40 bytes; a POSIX
/// zone specification may be longer).
pub const MAX_ZONE_TEXT: usize = 256;

/// This server's corgipile version.
pub fn this_version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The versions a message says it was written by, read before the rest of it (whose fields may
/// mean something else in another version). A field missing is an older sender's: empty, 0.
#[derive(Deserialize)]
pub struct Versions {
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub protocol: u32,
}

impl Versions {
    /// Whether they are this server's.
    pub fn are_ours(&self) -> bool {
        self.version == this_version() && self.protocol == PROTOCOL
    }

    /// "corgipile 0.5.0 (shard protocol 2)", for messages (a version cut short: it may come
    /// from anyone).
    pub fn describe(version: &str, protocol: u32) -> String {
        let version: String = version.chars().take(40).collect();
        let version = if version.is_empty() {
            "an unknown corgipile version".to_string()
        } else {
            format!("corgipile {version}")
        };
        if protocol == 0 {
            format!("{version} (a shard protocol older than 2)")
        } else {
            format!("{version} (shard protocol {protocol})")
        }
    }

    pub fn theirs(&self) -> String {
        Self::describe(&self.version, self.protocol)
    }

    pub fn ours() -> String {
        Self::describe(this_version(), PROTOCOL)
    }
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
    /// A family of per-group models: each group's key and model (`model` scores the rows of
    /// other groups).
    #[serde(default)]
    pub groups: Option<FamilyModels>,
    /// Score only the rows the training `RoundRequest::training` held out on this shard (its
    /// first epoch's rounds kept their ids: `RoundRequest::keep_held_out_ids`), not every row:
    /// a deploy gate scores the new version and the deployed one on them.
    #[serde(default)]
    pub held_out: bool,
}

/// What the coordinator asks of a shard.
#[derive(Clone, Serialize, Deserialize)]
pub struct RoundRequest {
    /// The coordinator's corgipile version and [`PROTOCOL`]: a shard of another refuses.
    pub version: String,
    #[serde(default)]
    pub protocol: u32,
    pub phase: Phase,
    /// This training, among the coordinator backend's: a shard keeps what it holds between
    /// rounds (a network's optimizer state, held-out validation rows) under it (see
    /// `exec::sgd::shard_round`).
    #[serde(default)]
    pub training: u64,
    pub epoch: u32,
    /// This round is blocks `round`, `round + rounds`, … of the epoch's order.
    pub round: u32,
    pub rounds: u32,
    pub n_features: usize,
    /// Train: every learner still going, with its parameters; Validate: each one's model of
    /// the epoch. Empty in the other phases.
    #[serde(default)]
    pub learners: Vec<LearnerRound>,
    /// With `"folds"`: how many (0: none); every shard's rows fall in them by the same hash of
    /// the row as on one server (`corgipile_ml::trials::fold_of`).
    #[serde(default)]
    pub folds: u32,
    /// The last epoch of a training with folds: each fold's learner scores its fold's rows.
    #[serde(default)]
    pub score_folds: bool,
    pub extras: LearnedStatistics,
    /// Evaluate: the model to score.
    #[serde(default)]
    pub evaluate: Option<EvaluateRequest>,
    /// Train a network: each learner's `weights` hold all its parameters (layer by layer,
    /// each layer's weights then biases) and its `bias` nothing.
    #[serde(default)]
    pub network: Option<NetworkRound>,
    /// Train a linear model of a label numbered by class (softmax, a text label): every
    /// shard's classes, numbered by the coordinator (`merge_classes`); every shard decodes
    /// labels by this numbering. Empty otherwise (a network's are in `network`).
    #[serde(default, deserialize_with = "class_list")]
    pub classes: Vec<ClassValue>,
    /// Train a list of feature columns: the preprocessing the coordinator merged from every
    /// shard's statistics round; every shard encodes its rows with it (as an evaluation
    /// encodes with a stored model's). A warm start's statistics round too: the stored
    /// model's (its `n_features` is the request's). None otherwise.
    #[serde(default)]
    pub preprocessing: Option<Preprocessor>,
    /// The statistics round of a list of feature columns with a `timestamptz` column: the
    /// coordinator's time zone, whose wall clock every shard reads such columns on (as the
    /// coordinator's plan says), for the one statistics round. None otherwise.
    #[serde(default)]
    pub zone: Option<String>,
    /// Importance: what to sample and permute.
    #[serde(default)]
    pub importance: Option<ImportanceAsk>,
    /// Train, a gated training (`"deploy": "if_better"`): the first epoch's rounds keep the
    /// tuple ids of the rows they hold out too, until the gate's evaluations of only those rows
    /// (`EvaluateRequest::held_out`) have run.
    #[serde(default)]
    pub keep_held_out_ids: bool,
    /// A training `"since"` a model (statistics and training rounds): every table mark the
    /// model recorded; each shard reads its own table's pages added since its mark (none:
    /// all of it). None otherwise.
    #[serde(default, deserialize_with = "crate::pipeline::mark::mark_list")]
    pub marks: Option<Vec<TableMark>>,
    /// Inference: the coefficients the Newton pass is at.
    #[serde(default)]
    pub inference: Option<InferenceAsk>,
    /// Train, per-group models (`"group_by"`): the groups that have a model, numbered by the
    /// coordinator from every shard's (their keys, in the order of their numbers); every shard
    /// numbers its rows' groups by them (a row of another group: the model of every row's
    /// only). Empty otherwise.
    #[serde(default, deserialize_with = "groups::group_keys")]
    pub groups: Vec<GroupKey>,
}

/// What a shard needs to train a network beyond its params (which give the hidden layers,
/// activation and optimizer): the output layer's classes in the
/// coordinator's numbering (empty for `mlp_regression`) and the regression target's
/// standardization.
#[derive(Clone, Serialize, Deserialize)]
pub struct NetworkRound {
    #[serde(deserialize_with = "class_list")]
    pub classes: Vec<ClassValue>,
    pub target_mean: f64,
    pub target_scale: f64,
}

/// What a shard answers.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct RoundReply {
    /// The shard's corgipile version and [`PROTOCOL`] (a shard before protocol 2 sends
    /// neither): the coordinator refuses a reply of another.
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub protocol: u32,
    pub rows: u64,
    pub rows_skipped: u64,
    /// Statistics: the shard's, and its dense rows' width (None: no rows or sparse).
    pub stats: Option<FeatureStats>,
    pub width: Option<usize>,
    /// Statistics of a label numbered by class: the shard's classes in its own numbering
    /// (its statistics count rows by these indices); the coordinator merges every shard's.
    #[serde(default, deserialize_with = "class_list")]
    pub classes: Vec<ClassValue>,
    /// Train: each learner's model after the round and the round's progressive metrics;
    /// Validate: each one's score on the shard's held-out rows (in the request's order).
    #[serde(default)]
    pub learners: Vec<LearnerReply>,
    /// Evaluate: the shard's metrics, to merge.
    #[serde(default)]
    pub evaluation: Option<EvaluationPart>,
    /// Statistics of a list of feature columns: what the shard's statistics pass learned of
    /// them (category counts, moments, quantile sketches), for the coordinator to merge into
    /// one preprocessing (checked there against its own plans).
    #[serde(default)]
    pub columns: Option<StatsPart>,
    /// Importance: the scores of the shard's sample, as it is and permuted.
    #[serde(default)]
    pub importance: Option<ImportancePart>,
    /// Evaluate a family of per-group models: each group's metrics, then the other rows'.
    #[serde(default)]
    pub group_evaluations: Option<Vec<EvaluationPart>>,
    /// Statistics: the shard table's mark, taken before the scan (None: a table whose pages
    /// say nothing of what was added, such as a partitioned one).
    #[serde(default)]
    pub mark: Option<TableMark>,
    /// Inference: what the shard's Newton pass summed.
    #[serde(default)]
    pub information: Option<InformationPart>,
    /// Statistics with `"group_by"`: the shard's groups, each key once with its rows, in the
    /// order it met them; the coordinator adds every shard's up.
    #[serde(default, deserialize_with = "groups::group_rows")]
    pub groups: Vec<GroupRows>,
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
    /// A request of `phase` in `training` (0: none) from this corgipile, for one round of one
    /// epoch, carrying nothing else: callers set what their phase sends.
    pub fn new(phase: Phase, training: u64) -> RoundRequest {
        RoundRequest {
            version: this_version().to_string(),
            protocol: PROTOCOL,
            phase,
            training,
            epoch: 1,
            round: 0,
            rounds: 1,
            n_features: 0,
            learners: Vec::new(),
            folds: 0,
            score_folds: false,
            extras: LearnedStatistics::default(),
            evaluate: None,
            network: None,
            classes: Vec::new(),
            preprocessing: None,
            zone: None,
            importance: None,
            keep_held_out_ids: false,
            marks: None,
            inference: None,
            groups: Vec::new(),
        }
    }

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
        if let Some(p) = &self.preprocessing {
            // A training round's, or a warm start's statistics round's (a stored model's).
            if !matches!(
                self.phase,
                Phase::Train | Phase::Statistics | Phase::Inference
            ) {
                return Err("a preprocessing in a round that reads no training rows".into());
            }
            if !p.is_sound() || p.n_features != self.n_features {
                return Err(format!(
                    "a preprocessing of {} features whose columns do not tile them, for a model of {}",
                    p.n_features, self.n_features
                ));
            }
        }
        if let Some(marks) = &self.marks {
            if !matches!(self.phase, Phase::Train | Phase::Statistics) {
                return Err("table marks in a round that trains nothing".into());
            }
            check_marks(marks)?;
        }
        if let Some(zone) = &self.zone {
            if self.phase != Phase::Statistics || zone.is_empty() || zone.len() > MAX_ZONE_TEXT {
                return Err("a time zone other than a statistics round's".into());
            }
        }
        if let Some(n) = &self.network {
            // The network's shape follows from the shard's params: checked there.
            if self.phase != Phase::Train
                || self.evaluate.is_some()
                || self.n_features == 0
                || !n.target_mean.is_finite()
                || !(n.target_scale.is_finite() && n.target_scale > 0.0)
            {
                return Err("a network round of another shape than a coordinator sends".into());
            }
            learners::check_request(self, outputs)?;
            groups::check_request(self)?;
            if !self.classes.is_empty() {
                return Err("classes beside a network's own".into());
            }
            check_classes(&n.classes)?;
            return self.extras.check(self.n_features, n.classes.len());
        }
        check_classes(&self.classes)?;
        if !matches!(self.phase, Phase::Train | Phase::Inference) && !self.classes.is_empty() {
            return Err("classes in a round that trains nothing".into());
        }
        if (self.phase == Phase::Inference) != self.inference.is_some() {
            return Err("coefficients for a Newton pass in another phase, or none".into());
        }
        if let Some(ask) = &self.inference {
            ask.check(self.n_features)?;
            // A binary kind's two labels, as its trainer saw them: how the rows' labels count.
            self.extras.check(self.n_features, 2)?;
        }
        learners::check_request(self, outputs)?;
        if self.phase == Phase::Train {
            // A softmax's class weights weigh its classes; a binary kind's its two labels
            // (values, or the two classes of a text label), which must come with them.
            let softmax = outputs > 1;
            if softmax && self.classes.len() != outputs {
                return Err(format!(
                    "a model of {outputs} outputs for {} classes",
                    self.classes.len()
                ));
            }
            self.extras
                .check(self.n_features, if softmax { outputs } else { 2 })?;
            if !softmax && self.extras.class_weights.is_some() && self.extras.label_values.is_none()
            {
                return Err("class weights without the label values they weigh".into());
            }
        }
        if (self.phase == Phase::Importance) != self.importance.is_some() {
            return Err("what to permute in another phase, or nothing to permute".into());
        }
        // A validation round's models travel with its learners (`LearnerRound::score`).
        let scores = matches!(self.phase, Phase::Evaluate | Phase::Importance);
        if scores != self.evaluate.is_some() {
            return Err("a model to evaluate in another phase, or none to evaluate".into());
        }
        if self.phase == Phase::Validate {
            // A binary kind's two labels as its trainer saw them: how the held-out rows score.
            let e = self.learners[0].score.as_ref().expect("checked above");
            self.extras.check(e.model.n_features(), 2)?;
        }
        if let Some(ask) = &self.importance {
            ask.check()?;
            let tables = self.evaluate.as_ref().is_some_and(|e| e.tables.is_some());
            if tables || !self.learners.is_empty() {
                return Err("an importance round of another shape than a coordinator sends".into());
            }
        }
        if let Some(e) = &self.evaluate {
            if e.preprocessing.as_ref().is_some_and(|p| !p.is_sound()) {
                return Err("a preprocessing whose columns do not tile its features".into());
            }
            if let Some(family) = &e.groups {
                if self.phase != Phase::Evaluate || e.tables.is_some() || e.held_out {
                    return Err("per-group models in a round that evaluates no family".into());
                }
                family.check(&e.model)?;
            }
            // Held-out rows are a training's (its number says which), scored without tables.
            if e.held_out
                && (self.phase != Phase::Evaluate || self.training == 0 || e.tables.is_some())
            {
                return Err("held-out rows to score outside a gate's evaluation".into());
            }
        }
        if self.keep_held_out_ids && (self.phase != Phase::Train || self.training == 0) {
            return Err("held-out rows to keep in a round that trains nothing".into());
        }
        groups::check_request(self)
    }
}

impl RoundReply {
    /// Why this reply (from a shard server: maybe from code its role wrote) does not answer
    /// `request`: another shape than asked for, values that are not finite, impossible
    /// counts. Sizes were bounded when it was parsed.
    pub fn check(&self, request: &RoundRequest, kind: ModelKind) -> Result<(), String> {
        // More rows than one PostgreSQL table can hold (2^32 pages of at most 291 tuples).
        const MAX_ROWS: u64 = 1 << 41;
        if self.rows > MAX_ROWS || self.rows_skipped > MAX_ROWS {
            return Err(format!(
                "{} rows and {} skipped rows",
                self.rows, self.rows_skipped
            ));
        }
        if request.phase != Phase::Statistics && self.columns.is_some() {
            return Err("statistics of feature columns where none were asked for".into());
        }
        if request.phase != Phase::Evaluate && self.group_evaluations.is_some() {
            return Err("per-group metrics where none were asked for".into());
        }
        if request.phase != Phase::Inference && self.information.is_some() {
            return Err("an information part where no Newton pass was asked for".into());
        }
        if request.phase != Phase::Importance && self.importance.is_some() {
            return Err("importance scores where none were asked for".into());
        }
        if let Some(mark) = &self.mark {
            if request.phase != Phase::Statistics {
                return Err("a table mark where no statistics were asked for".into());
            }
            mark.check()?;
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
                if self.evaluation.is_some() {
                    return Err("a model or metrics where statistics were asked for".into());
                }
                // The columns' statistics themselves are checked against the coordinator's
                // plans before they are merged (`StatsBuilder::check_part`).
                if self.columns.as_ref().is_some_and(|p| p.rows != self.rows) {
                    return Err(
                        "statistics of its feature columns of another number of rows".into(),
                    );
                }
                check_classes(&self.classes)?;
                // Rows counted by class index: every index one of the classes sent.
                if let (Some(stats), false) = (&self.stats, self.classes.is_empty()) {
                    let k = self.classes.len() as f64;
                    if stats
                        .class_counts()
                        .iter()
                        .any(|&(i, _)| !(i >= 0.0 && i < k && i.fract() == 0.0))
                    {
                        return Err("rows counted by classes it did not send".into());
                    }
                }
            }
            Phase::Train => {
                if self.stats.is_some()
                    || self.width.is_some()
                    || self.evaluation.is_some()
                    || !self.classes.is_empty()
                {
                    return Err("statistics or metrics where a model was asked for".into());
                }
            }
            Phase::Validate => {
                if self.stats.is_some()
                    || self.width.is_some()
                    || self.evaluation.is_some()
                    || !self.classes.is_empty()
                {
                    return Err(
                        "a model or statistics where a validation score was asked for".into(),
                    );
                }
            }
            Phase::Importance => self.check_importance(request, kind)?,
            Phase::Inference => {
                if self.stats.is_some()
                    || self.width.is_some()
                    || self.evaluation.is_some()
                    || !self.classes.is_empty()
                {
                    return Err("a model or metrics where an information part was asked for".into());
                }
                let Some(ask) = &request.inference else {
                    return Err("an information part for no coefficients".into());
                };
                ask.check_part(request.n_features, self.information.as_ref(), self.rows)?;
            }
            Phase::Evaluate => {
                let Some(part) = &self.evaluation else {
                    return Err("no evaluation".into());
                };
                if !self.classes.is_empty() {
                    return Err("classes where metrics were asked for".into());
                }
                if let Some(model) = &request.evaluate {
                    part.check(model.model.kind(), model.classes.len(), model.tables)?;
                    match (&model.groups, &self.group_evaluations) {
                        (None, None) => {}
                        (Some(family), Some(parts)) => family.check_parts(
                            parts,
                            model.model.kind(),
                            model.classes.len(),
                            Some(part.rows_scored()),
                        )?,
                        _ => return Err("per-group metrics for another model than a family".into()),
                    }
                }
            }
        }
        groups::check_reply(self, request)?;
        learners::check_reply(&self.learners, request, self.rows, kind)
    }

    /// The tuples the shard trained in the round (its learners': the most any trained).
    pub fn tuples(&self) -> u64 {
        self.learners.iter().map(|l| l.tuples).max().unwrap_or(0)
    }
}

impl RoundReply {
    /// `check` of an importance round's reply: the shard's count of rows, or its scores.
    fn check_importance(&self, request: &RoundRequest, kind: ModelKind) -> Result<(), String> {
        let (Some(ask), Some(evaluate)) = (&request.importance, &request.evaluate) else {
            return Err("an importance reply to another request".into());
        };
        if self.stats.is_some()
            || self.width.is_some()
            || self.evaluation.is_some()
            || !self.classes.is_empty()
            || !self.learners.is_empty()
        {
            return Err("a model or metrics where importance scores were asked for".into());
        }
        match (&self.importance, ask.count) {
            (None, true) => Ok(()),
            (None, false) => Err("no importance scores".into()),
            (Some(part), _) => {
                let columns =
                    column_ranges(evaluate.preprocessing.as_ref(), evaluate.model.n_features());
                part.check(ask, columns.len(), self.rows, Metric::of(kind))
            }
        }
    }
}
