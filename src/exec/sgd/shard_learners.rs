//! A shard's learners of one training round (see `pipeline::protocol::learners`): one per
//! learner the coordinator sent — a search's configuration, resolved here from this shard's
//! params as one server's search resolves it, or the one model of a training that does not
//! search — each from the parameters it was sent, trained side by side on the round's buffers
//! by the trainer one server's search uses (`corgipile_ml::trials::Trials`); with `"folds"`, a
//! fold's learner skips its fold's rows and, in the last epoch, scores them; with `"group_by"`,
//! a group's learner trains on its group's rows only (`Trials::with_groups`).

use super::{checked_learner, SgdNode};
use crate::pg::error::{raise, raise_param_error, raise_train_error};
use crate::pipeline::protocol::{LearnerReply, LearnerRound, RoundRequest};
use corgipile_ml::learner::Shape;
use corgipile_ml::scoring::ValidationScore;
use corgipile_ml::trainer::{EpochStats, TrainError};
use corgipile_ml::trials::Trials;
use pgrx::PgSqlErrorCode;

impl SgdNode {
    /// The round's learners, each set to the parameters the coordinator sent (of `shape`). A
    /// configuration this shard's search does not have is a protocol violation.
    pub(super) fn round_learners(&self, request: &RoundRequest, shape: &Shape) -> Trials {
        let kind = self.config.model;
        let folds = self.config.params.folds.unwrap_or(0);
        if request.folds != folds {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: another number of folds than these params have",
                None,
            );
        }
        let configurations = self
            .config
            .params
            .configurations(kind)
            .unwrap_or_else(|e| raise_param_error(e));
        let learners = request
            .learners
            .iter()
            .map(|sent| {
                let Some((_, params)) = configurations
                    .iter()
                    .find(|(c, _)| *c == sent.configuration)
                else {
                    raise(
                        PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                        "corgipile shard round: a learner of a configuration the search of these params does not have",
                        None,
                    )
                };
                let mut config = params.train_config(kind);
                // The coordinator averages the rounds' models; a shard returns its last iterate.
                config.average_from_epoch = None;
                request.extras.clone().apply(&mut config);
                let learner = checked_learner(
                    kind,
                    config,
                    params,
                    shape,
                    self.config.max_model_bytes,
                );
                let mut learner = learner.unwrap_or_else(|e| {
                    raise_train_error(e, &|v| v.to_string(), params.normalize)
                });
                if !learner.set_parameters(&start_of(sent)) {
                    raise(
                        PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                        "corgipile shard round: the coordinator's model has another shape",
                        None,
                    );
                }
                (learner, sent)
            })
            .collect::<Vec<_>>();
        // Per-group models: the rows' groups are numbered by the round's (`shard::groups`).
        if self.config.groups.is_some() {
            let learners = learners.into_iter().map(|(l, sent)| (l, sent.group));
            return Trials::with_groups(learners.collect(), request.groups.len());
        }
        let learners = learners
            .into_iter()
            .map(|(l, sent)| (l, sent.fold.map(|f| f as usize)))
            .collect();
        let mut trials = Trials::with_folds(learners, folds as usize);
        if request.score_folds {
            // The last epoch: the scaling the learners apply, to score rows as they are read.
            trials.score_holdouts(request.extras.standardizer.clone());
        }
        trials
    }
}

/// A learner's parameters as sent: its weights, then its biases.
pub(super) fn start_of(sent: &LearnerRound) -> Vec<f64> {
    sent.weights.iter().chain(&sent.bias).copied().collect()
}

/// Each learner's answer after the round: its parameters (split as they were sent) and the
/// round's statistics, or set aside when it diverged while others went on. `parameters`: per
/// learner, what it learned (Err: set aside) — raises if a sparse row's index grew a model
/// beyond the features sent (`relation`, for the message).
pub(super) fn learner_replies(
    sent: &[LearnerRound],
    learned: Vec<Result<Vec<f64>, TrainError>>,
    (stats, holdouts): (Vec<Option<EpochStats>>, Vec<Option<ValidationScore>>),
    relation: &str,
) -> Vec<LearnerReply> {
    sent.iter()
        .zip(learned)
        .zip(stats.into_iter().zip(holdouts))
        .map(
            |((sent, learned), (stats, holdout))| match (learned, stats) {
                (Ok(mut weights), Some(stats)) => {
                    if weights.len() != sent.weights.len() + sent.bias.len() {
                        raise(
                            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
                            format!("a sparse index of {relation} is beyond n_features"),
                            None,
                        );
                    }
                    let bias = weights.split_off(sent.weights.len());
                    LearnerReply {
                        weights,
                        bias,
                        tuples: stats.tuples,
                        loss: stats.loss,
                        accuracy: stats.accuracy,
                        r2: stats.r2,
                        holdout: holdout.map(|s| s.part()),
                        group: sent.group,
                        ..LearnerReply::default()
                    }
                }
                _ => LearnerReply {
                    set_aside: true,
                    group: sent.group,
                    ..LearnerReply::default()
                },
            },
        )
        .collect()
}
