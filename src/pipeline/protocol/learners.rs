//! The learners of a sharded training's round (shard protocol 5): a training round carries
//! every learner still going — a search's configurations, with `"folds"` one per fold beside
//! each, or the one model of a training that does not search — each with its parameters; the
//! shard trains them side by side on the same buffers and answers per learner (in the last
//! epoch, a fold's learner also its score of the fold's rows it held out). A validation round
//! carries each learner's model of the epoch, and the shard answers each one's score of its
//! held-out rows. A training of one model is a list of one. Since protocol 9, a network
//! learner's parameters are its own configuration's (hidden sizes may differ), and the shard
//! keeps each learner's optimizer state between rounds, keyed by its configuration and fold.

use super::{EvaluateRequest, Phase, RoundRequest};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::search::MAX_TRIALS;

/// Most folds a training has (the `folds` param's bound).
const MAX_FOLDS: u32 = 20;
use corgipile_ml::scoring::ValidationPart;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One learner of a round, as the coordinator sends it.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct LearnerRound {
    /// The search configuration it trains: its searched params as the search resolves them
    /// (`TrainParams::configurations`; the shard resolves the same search from its params and
    /// trains the configuration equal to this one). Empty without a search.
    #[serde(default)]
    pub configuration: Map<String, Value>,
    /// With `"folds"`: the fold whose rows it never trains on (None: the configuration's model
    /// of every row).
    #[serde(default)]
    pub fold: Option<u32>,
    /// With `"group_by"`: the group (its number in `RoundRequest::groups`) whose rows alone it
    /// trains on (None: the model of every row).
    #[serde(default)]
    pub group: Option<u32>,
    /// Train: its parameters at the round's start (a linear model's weights then its biases; a
    /// network's every parameter in `weights`, layer by layer).
    #[serde(default)]
    pub weights: Vec<f64>,
    #[serde(default)]
    pub bias: Vec<f64>,
    /// Train, a model a shard trains with a kept optimizer (a network, a factorization
    /// machine): the drift correction this shard's steps add to their gradient, one value per
    /// parameter (empty in its first round: none yet), and the shard answers its control
    /// (`LearnerReply::control`; see `corgipile_ml::trainer::Controls`). None: no correction.
    #[serde(default)]
    pub correction: Option<Vec<f64>>,
    /// Validate: its model of the epoch (in the table's units) to score on the rows the shard
    /// held out.
    #[serde(default)]
    pub score: Option<EvaluateRequest>,
}

/// What a shard answers of one learner, in the request's order.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct LearnerReply {
    /// The group it was sent for (`LearnerRound::group`).
    #[serde(default)]
    pub group: Option<u32>,
    /// Train: its parameters after the round, and the round's progressive metrics.
    #[serde(default)]
    pub weights: Vec<f64>,
    #[serde(default)]
    pub bias: Vec<f64>,
    #[serde(default)]
    pub tuples: u64,
    #[serde(default)]
    pub loss: f64,
    #[serde(default)]
    pub accuracy: Option<f64>,
    #[serde(default)]
    pub r2: Option<f64>,
    /// Train, when a correction was sent and the shard trained tuples: the mean gradient of
    /// its round's steps, one value per parameter (its control for the next round).
    #[serde(default)]
    pub control: Option<Vec<f64>>,
    /// Train: it diverged on this shard while others went on (as one server sets aside a
    /// search's configuration): no parameters; the coordinator sets it aside.
    #[serde(default)]
    pub set_aside: bool,
    /// Validate: its model's score on the shard's held-out rows, to merge.
    #[serde(default)]
    pub validation: Option<ValidationPart>,
    /// Train, when the request says `score_folds`: a fold's learner's score of that fold's
    /// rows of the round (None: no row of its fold, or a two-class learner that met one label).
    #[serde(default)]
    pub holdout: Option<ValidationPart>,
}

fn all_finite(values: &[f64]) -> bool {
    values.iter().all(|v| v.is_finite())
}

/// Why the learners of `request` are not what a coordinator sends: none in a round that
/// trains or validates, some in one that does not, more than a search has, a configuration
/// twice, parameters or models of another shape (`outputs`: a linear model's outputs).
pub fn check_request(request: &RoundRequest, outputs: usize) -> Result<(), String> {
    let learners = &request.learners;
    let has_learners = matches!(request.phase, Phase::Train | Phase::Validate);
    // A search's learners with their folds', or per-group models' (the model of every row's
    // and one per group).
    let most = (MAX_TRIALS * (1 + MAX_FOLDS as usize)).max(request.groups.len() + 1);
    if has_learners == learners.is_empty() || learners.len() > most {
        return Err(format!(
            "{} learners in a round of phase {:?}",
            learners.len(),
            request.phase
        ));
    }
    if request.folds == 1 || request.folds > MAX_FOLDS {
        return Err(format!("{} folds", request.folds));
    }
    if request.score_folds && (request.phase != Phase::Train || request.folds == 0) {
        return Err("folds to score in a round without folds".into());
    }
    for (i, l) in learners.iter().enumerate() {
        if l.fold.is_some_and(|f| f >= request.folds) {
            return Err("a learner of a fold the round does not have".into());
        }
        let same = |o: &LearnerRound| {
            o.configuration == l.configuration && o.fold == l.fold && o.group == l.group
        };
        if learners[..i].iter().any(same) {
            return Err("a configuration twice among the learners".into());
        }
    }
    match request.phase {
        Phase::Train => {
            for l in learners {
                if l.score.is_some() {
                    return Err("a model to score in a round that trains".into());
                }
                if !all_finite(&l.weights) || !all_finite(&l.bias) {
                    return Err("weights that are not finite".into());
                }
                if let Some(c) = &l.correction {
                    let fits = c.is_empty() || c.len() == l.weights.len();
                    if request.network.is_none() || !fits || !all_finite(c) {
                        return Err("a drift correction of another shape than the model's".into());
                    }
                }
                if request.network.is_some() {
                    // A network's shape follows from the shard's params: checked there.
                    if !l.bias.is_empty() {
                        return Err(
                            "a network round of another shape than a coordinator sends".into()
                        );
                    }
                    continue;
                }
                let weights = request.n_features.checked_mul(outputs);
                if request.n_features == 0
                    || weights != Some(l.weights.len())
                    || l.bias.len() != outputs
                {
                    return Err(format!(
                        "a model of {} weights and {} biases for {} features",
                        l.weights.len(),
                        l.bias.len(),
                        request.n_features
                    ));
                }
            }
        }
        Phase::Validate => {
            let first = learners[0].score.as_ref().map(|s| &s.model);
            for l in learners {
                let Some(score) = &l.score else {
                    return Err("a learner without its model in a validation round".into());
                };
                if !l.weights.is_empty() || !l.bias.is_empty() || score.tables.is_some() {
                    return Err(
                        "a validation round of another shape than a coordinator sends".into(),
                    );
                }
                if score.preprocessing.as_ref().is_some_and(|p| !p.is_sound()) {
                    return Err("a preprocessing whose columns do not tile its features".into());
                }
                // A validation round scores the rows this backend held out itself, one model
                // per learner: no gate's evaluation, no family.
                if score.held_out {
                    return Err("held-out rows to score outside a gate's evaluation".into());
                }
                if score.groups.is_some() {
                    return Err("per-group models in a round that evaluates no family".into());
                }
                // One shape for every learner (of one kind): what the shard's size check saw.
                let model = &score.model;
                if first.is_some_and(|f| {
                    f.n_features() != model.n_features() || f.n_outputs() != model.n_outputs()
                }) {
                    return Err("models of several shapes in one validation round".into());
                }
            }
        }
        Phase::Statistics | Phase::Evaluate | Phase::Importance | Phase::Inference => {}
    }
    Ok(())
}

/// Why a shard's learners do not answer `request`'s: another count than asked, parameters of
/// another shape or not finite, impossible metrics or counts (`rows`: the shard's), a score
/// missing or malformed, anything a phase does not ask for.
pub fn check_reply(
    learners: &[LearnerReply],
    request: &RoundRequest,
    rows: u64,
    kind: ModelKind,
) -> Result<(), String> {
    let asked = match request.phase {
        Phase::Train | Phase::Validate => request.learners.len(),
        Phase::Statistics | Phase::Evaluate | Phase::Importance | Phase::Inference => 0,
    };
    if learners.len() != asked {
        return Err(format!(
            "{} learners where {asked} were sent",
            learners.len()
        ));
    }
    for (reply, sent) in learners.iter().zip(&request.learners) {
        super::groups::check_learner(reply, sent)?;
        match request.phase {
            Phase::Train => check_trained(reply, sent, rows, kind, request.score_folds)?,
            Phase::Validate => {
                let Some(part) = &reply.validation else {
                    return Err("no validation score".into());
                };
                part.check(kind)?;
                if !reply.weights.is_empty()
                    || !reply.bias.is_empty()
                    || reply.set_aside
                    || reply.holdout.is_some()
                {
                    return Err(
                        "a model or statistics where a validation score was asked for".into(),
                    );
                }
            }
            Phase::Statistics | Phase::Evaluate | Phase::Importance | Phase::Inference => {}
        }
    }
    Ok(())
}

/// One learner's answer to a training round.
fn check_trained(
    reply: &LearnerReply,
    sent: &LearnerRound,
    rows: u64,
    kind: ModelKind,
    score_folds: bool,
) -> Result<(), String> {
    if reply.validation.is_some() {
        return Err("statistics or metrics where a model was asked for".into());
    }
    if let Some(part) = &reply.holdout {
        if !score_folds || sent.fold.is_none() {
            return Err("a fold's score where none was asked for".into());
        }
        part.check(kind)?;
    }
    if reply.set_aside {
        if !reply.weights.is_empty() || !reply.bias.is_empty() || reply.control.is_some() {
            return Err("a model of a learner set aside".into());
        }
        return Ok(());
    }
    // A control exactly when a correction was sent and the shard trained (one per parameter).
    let controlled = sent.correction.is_some() && reply.tuples > 0;
    if let Some(c) = &reply.control {
        if !controlled || c.len() != sent.weights.len() + sent.bias.len() || !all_finite(c) {
            return Err("a control of another shape than the model's, or not asked for".into());
        }
    } else if controlled {
        return Err("no control where a drift correction was sent".into());
    }
    if reply.weights.len() != sent.weights.len() || reply.bias.len() != sent.bias.len() {
        return Err(format!(
            "a model of {} weights and {} biases, where {} and {} were sent",
            reply.weights.len(),
            reply.bias.len(),
            sent.weights.len(),
            sent.bias.len()
        ));
    }
    if !all_finite(&reply.weights) || !all_finite(&reply.bias) {
        return Err("weights that are not finite".into());
    }
    let metric_ok = |m: Option<f64>, lo: f64, hi: f64| {
        m.is_none_or(|v| v.is_finite() && (lo..=hi).contains(&v))
    };
    if !reply.loss.is_finite()
        || reply.loss < 0.0
        || reply.tuples > rows
        || !metric_ok(reply.accuracy, 0.0, 1.0)
        || !metric_ok(reply.r2, f64::NEG_INFINITY, 1.0)
    {
        return Err("impossible loss, metrics or tuple counts".into());
    }
    Ok(())
}
