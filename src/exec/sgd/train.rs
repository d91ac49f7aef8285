//! Training mode, the driver: what is learned before the epochs (the statistics pass, groups,
//! warm starts), the worker team, the learners, the epochs (`epoch_loop.rs`) under the
//! training's policy (`corgipile_ml::fit`), and each stored learner's trial.

use super::collect::CollectedRows;
use super::epoch_loop::{RowsRead, Sgd};
use super::side_by_side::pool_scores;
use super::{SgdNode, SgdTask};
use crate::catalog::warm_start::WarmStart;
use crate::exec::tuple_shuffle::ShuffledBuffer;
use crate::parallel::{Member, Team};
use crate::pg::error::raise;
use crate::pg::error::{raise_param_error, raise_train_error};
use crate::pg::progress;
use crate::pipeline::ClassValue;
use crate::pipeline::GroupsFound;
use crate::pipeline::{FeatureLayout, HeldOutRows, Mode, TrainOutcome, Trial, ValidationSplit};
use corgipile_ml::fit::{Finished, Fit, Notices};
use corgipile_ml::learner::Learner;
use corgipile_ml::model::{Labels, Predictor};
use corgipile_ml::params::search::configuration_kind;
use corgipile_ml::params::{Configuration, Patience, StatisticsPass};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trained::{Model, PartsError};
use corgipile_ml::trainer::TrainConfig;
use pgrx::{check_for_interrupts, pg_sys, PgSqlErrorCode};
use std::ffi::CString;
use std::time::Instant;

/// Train a model; a validation relation's rows (collected before) may come with it. With
/// `"workers"`, parallel workers plan `sql` over `relid` as the leader did.
pub struct Train {
    pub validation_rows: Option<CollectedRows>,
    pub relid: pg_sys::Oid,
    pub sql: CString,
    /// `"warm_start"`: the stored model every learner starts from.
    pub warm_start: Option<WarmStart>,
    /// Record which rows are held out (a gated training scores the deployed version on them).
    pub record_held_out: bool,
    /// Profile the stored models' predictions after training (see `predictions.rs`).
    pub profile_predictions: bool,
}

/// What a training gives back: every configuration's trial (one, unless the params search),
/// and, when asked, which rows of the relation it held out and validated on.
pub struct Trained {
    pub trials: Vec<Trial>,
    pub held_out: Option<HeldOutRows>,
}

impl SgdTask for Train {
    type Output = Trained;
    const MODE: Mode = Mode::Train;

    unsafe fn run(self, node: &mut SgdNode) -> Trained {
        node.warm_start = self.warm_start;
        if self.record_held_out {
            node.shuffle().rows_mut().record_held_out();
        }
        let role = Role::Lead {
            relid: self.relid,
            sql: self.sql,
        };
        let mut trials = node
            .train(self.validation_rows.as_ref(), role)
            .expect("the leader of a training returns its outcome");
        node.infer(&mut trials);
        let held_out = node.shuffle().rows_mut().take_held_out();
        // After "inference" (whose passes polish the model): the stored model's predictions.
        if self.profile_predictions {
            node.profile_predictions(&mut trials, self.validation_rows.as_ref());
        }
        Trained { trials, held_out }
    }
}

/// What the trials of a training are made from, after its epochs.
struct Ended<'a> {
    configurations: &'a [Configuration],
    groups: Option<&'a GroupsFound>,
    standardizer: Option<&'a Standardizer>,
    /// Binary kinds: the trainer's (negative, positive) labels.
    label_map: Option<(f64, f64)>,
    read: RowsRead,
    statistics_seconds: Option<f64>,
    started: Instant,
}

/// How this process takes part in a training.
pub enum Role {
    /// The backend: alone, or leading the parallel workers it starts (`"workers"`).
    Lead { relid: pg_sys::Oid, sql: CString },
    /// A parallel worker.
    Member(Box<Member>),
}

impl SgdNode {
    /// A parallel worker's training (its share of the leader's).
    pub(crate) fn train_in_team(&mut self, share: Member) {
        // SAFETY: a private method of this node that needs only what every method of a live
        // SgdNode has (its child initialized, inside the executor run); as a member it follows
        // the same epochs and rounds as the leader (the same plan), as the team's calls ask.
        unsafe { self.train(None, Role::Member(Box::new(share))) };
    }
}

/// What a training learned before its epochs: the trainer's configuration with the statistics
/// pass's findings, the groups that get a model, a warm start's model, the pass's seconds.
struct BeforeEpochs {
    train_config: TrainConfig,
    groups: Option<GroupsFound>,
    warm_model: Option<Model>,
    statistics_seconds: Option<f64>,
    /// Whether a learner is a network.
    network: bool,
}

impl SgdNode {
    /// Every epoch; each configuration's model and history (one, unless the params search).
    /// None only in a parallel worker that had nothing to train (no process had a row: the
    /// leader raises the ERROR), or whose part is done (the leader stores the models).
    unsafe fn train(
        &mut self,
        validation_rows: Option<&CollectedRows>,
        role: Role,
    ) -> Option<Vec<Trial>> {
        let started = Instant::now();
        let params = self.config.params.clone();
        // A search's configurations (each checked as a param) before any work.
        let configurations = params
            .configurations(self.config.model)
            .unwrap_or_else(|e| raise_param_error(e));
        let searching = params.search.is_some();
        let (lead, member) = match role {
            Role::Lead { relid, sql } => (Some((relid, sql)), None),
            Role::Member(share) => (None, Some(*share)),
        };
        // The leader reports the whole training; workers report nothing.
        if member.is_none() {
            self.progress = Some(progress::start(
                &self.config.relation,
                self.config.model.name(),
                params.epochs,
            ));
        }
        self.first_epoch = None;
        let before = self.before_epochs(&configurations, member.as_ref());
        let mut team = self.join_team(lead, member, &before);
        let shuffle = self.shuffle();
        // Epoch 1's clock starts here: its first buffer (read now, to learn the rows' width) is
        // part of its time, as every later epoch's first buffer is part of that epoch's.
        let first_started = Instant::now();
        let first = shuffle.next_buffer(None);
        let n_features = self.n_features(first.as_ref(), team.as_ref(), before.network)?;
        self.check_inference_size(n_features);
        let BeforeEpochs {
            train_config,
            groups,
            warm_model,
            statistics_seconds,
            ..
        } = before;
        let standardizer = train_config.standardizer.clone();
        let (mut trainer, plan) = match &groups {
            Some(groups) => self.per_group(&configurations[0].1, train_config, n_features, groups),
            None => self.side_by_side(&configurations, train_config, n_features, searching),
        };
        if let Some(stored) = &warm_model {
            for learner in trainer.learners_mut() {
                match learner.start_from(stored) {
                    Ok(true) => {}
                    Ok(false) => self.warm_start_misfit(n_features),
                    Err(e) => raise_train_error(e, &self.label_text(), params.normalize),
                }
            }
        }
        if let Some(t) = team.as_mut() {
            // Every learner exchanges with its own shared model; an exchange reads and writes
            // every weight: a big model exchanges less often.
            let starts: Vec<Vec<f64>> = trainer.learners_mut().map(|l| l.start_values()).collect();
            let shared = t.shared_models(n_features, &starts);
            for (learner, shared) in trainer.learners_mut().zip(shared) {
                let n_values = learner.n_params();
                learner.set_exchange(shared, n_values as u64 / 4);
            }
        }
        // Single-buffered, the backend trains: it must still answer cancel between rows.
        trainer.set_interrupt(|| {
            Box::new(|| {
                check_for_interrupts!();
                false
            })
        });
        // Each learner's epochs, early stopping (patience: the best epoch's model kept),
        // whether it has stopped or was set aside, and what the training reports.
        let patience: Vec<Option<Patience>> =
            configurations.iter().map(|(_, p)| p.patience).collect();
        let notices = Notices {
            verbose: self.verbose,
            epochs: params.epochs,
            metric: self.config.model.metric_name(),
            search: searching
                .then(|| (configurations.clone(), params.selection(self.config.model))),
            groups: groups.as_ref().map(|found| found.kept.len()),
        };
        let mut fit: Fit<Model> = Fit::new(plan, params.tolerance, &patience, notices);
        let mut sgd = Sgd::new(trainer, params.double_buffer);
        let read = self.run_epochs(
            &mut sgd,
            &mut fit,
            team.as_ref(),
            first,
            first_started,
            validation_rows,
            standardizer.as_ref(),
        );
        let mut trainer = sgd.finish();
        // The folds' scores on their held-out rows (with workers: every process's pooled).
        let mut holdouts = trainer.take_holdout_scores();
        if let (Some(t), true) = (&team, params.folds.unwrap_or(0) > 0) {
            holdouts = pool_scores(t, 2 * params.epochs + 1, holdouts);
        }
        let holdouts: Vec<_> = holdouts
            .into_iter()
            .map(|s| s.map(|s| s.finish()))
            .collect();
        if let Some(t) = team {
            // Every process's last steps are in the shared models now: continue from them,
            // and pool the iterate averages.
            for learner in trainer.learners_mut() {
                if let Err(e) = learner.exchange_last() {
                    raise_train_error(e, &self.label_text(), params.normalize);
                }
            }
            if !t.is_leader() {
                t.finish();
                return None;
            }
            self.rows_per_process = t.rows_per_process(self.epochs_run);
            t.wait_for_workers();
            trainer
                .learners_mut()
                .for_each(|l| l.adopt_shared_average());
            t.finish();
        }
        let label_map = trainer.label_map();
        self.stopped = fit.stopped();
        let finished = fit.finish(trainer.into_results(), holdouts);
        let ended = Ended {
            configurations: &configurations,
            groups: groups.as_ref(),
            standardizer: standardizer.as_ref(),
            label_map,
            read,
            statistics_seconds,
            started,
        };
        Some(self.trials(finished, &ended))
    }

    /// Before the epochs: a statistics pass when something must be learned from the rows first
    /// (scaling, class weights, a column list's preprocessing, a network's classes and target,
    /// the groups), the groups numbered, and a warm start's model. A parallel worker (`member`)
    /// gets the leader's.
    unsafe fn before_epochs(
        &mut self,
        configurations: &[Configuration],
        member: Option<&Member>,
    ) -> BeforeEpochs {
        let params = self.config.params.clone();
        let mut train_config = params.train_config(self.config.model);
        // A network needs its classes (its output layer's width) and a regression's target
        // statistics before it is built: always a statistics pass.
        let network = configurations.iter().any(|(c, _)| {
            configuration_kind(c, self.config.model)
                .family()
                .sized_by_statistics()
        });
        let tabular = self.config.layout == FeatureLayout::Tabular;
        // Classes numbered as they are met (softmax, a text label): with workers the leader
        // numbers them all first, and every process takes its numbering.
        let numbers_classes = self.numbers_classes_for_workers();
        // A column list learns its preprocessing in the statistics pass, unless it was
        // learned before (see `Learn`).
        let learning = self.shuffle().rows().is_learning();
        let mut statistics_seconds = None;
        if let Some(share) = member {
            // The leader's statistics pass learned these for the whole table.
            share.extras.clone().apply(&mut train_config);
            self.validation_elsewhere = share.extras.leader_holds_validation;
            self.label_moments = share.extras.label_moments;
        } else if (params.normalize && !tabular)
            || configurations.iter().any(|(_, p)| p.class_weight.is_some())
            || learning
            || network
            || numbers_classes
            || params.group_by.is_some()
        {
            progress::phase("statistics pass");
            let pass_started = Instant::now();
            // Means and scales are all this pass learns: a sample of the blocks gives them.
            let sample = params.statistics == StatisticsPass::Sample
                && !network
                && !numbers_classes
                && params.group_by.is_none()
                && configurations.iter().all(|(_, p)| p.class_weight.is_none())
                && self.config.validation_split == ValidationSplit::None
                && !matches!(self.config.layout, FeatureLayout::Sparse { .. })
                && !self.shuffle().rows().learns_categories();
            self.statistics_pass(&mut train_config, sample);
            statistics_seconds = Some(pass_started.elapsed().as_secs_f64());
            self.statistics_seconds = statistics_seconds;
        }
        let shuffle = self.shuffle();
        // Per-group models: the groups the statistics pass found big enough (numbered before
        // the first row of epoch 1 is read).
        // A parallel worker's are the leader's (its decoder numbers their keys alike).
        let groups = match member {
            Some(share) => share.extras.groups.clone(),
            None => params.group_by.as_ref().and_then(|_| {
                shuffle
                    .rows_mut()
                    .number_groups(params.min_group_rows.unwrap_or(1))
            }),
        };
        if tabular && !learning && member.is_none() {
            train_config.standardizer = shuffle.rows().scaling(params.fit_intercept);
        }
        let scaling = train_config.standardizer.as_ref();
        if let Some(s) = scaling.filter(|s| !s.center && !s.is_identity()) {
            shuffle.scale_sparse_rows(&s.scale);
        }
        // A warm start: the stored model's labels and the model every learner starts from (a
        // parallel worker gets the leader's).
        let warm_model = match member {
            Some(share) => share.extras.warm_start.clone().map(|parts| {
                parts
                    .into_model()
                    .unwrap_or_else(|e| raise_warm_start_parts(e))
            }),
            None => self.warm_start.as_ref().map(|w| {
                if let Some(values) = w.label_values(self.config.label) {
                    train_config.label_values = Some(values);
                }
                w.model().clone()
            }),
        };
        BeforeEpochs {
            train_config,
            groups,
            warm_model,
            statistics_seconds,
            network,
        }
    }

    /// With `"workers"`, the leader launches its team (none for a temporary table: parallel
    /// workers cannot read this session's temporary tables); a worker joins its leader's. Then
    /// this process reads its share of the blocks.
    unsafe fn join_team(
        &mut self,
        lead: Option<(pg_sys::Oid, CString)>,
        member: Option<Member>,
        before: &BeforeEpochs,
    ) -> Option<Team> {
        let params = &self.config.params;
        let shuffle = self.shuffle();
        match (lead, member) {
            (Some((relid, sql)), _) if params.workers > 0 => {
                self.workers_planned = params.workers;
                if crate::pg::names::is_temporary(relid) {
                    return None;
                }
                let mut learned = self.learned_statistics(&before.train_config);
                learned.groups = before.groups.clone();
                learned.leader_holds_validation = before.statistics_seconds.is_some();
                learned.warm_start = before.warm_model.as_ref().map(Model::to_parts);
                let team = Team::launch(
                    relid,
                    &sql,
                    &self.config,
                    learned,
                    shuffle.rows().preprocessor().cloned(),
                    shuffle.block_epoch(),
                    params.workers,
                )?;
                shuffle.set_share(team.share, shuffle.block_epoch());
                self.workers_launched = team.share.processes - 1;
                Some(team)
            }
            (_, Some(share)) => {
                shuffle.set_share(share.team.share, share.block_epoch);
                Some(share.team)
            }
            _ => None,
        }
    }

    /// How many features the rows have, from the first buffer (`first`; None: this process
    /// read no row) and, with workers, every process's: the ERROR of rows of different widths,
    /// or of no rows at all. None in a worker when no process had a row (the leader raises).
    unsafe fn n_features(
        &self,
        first: Option<&ShuffledBuffer>,
        team: Option<&Team>,
        network: bool,
    ) -> Option<usize> {
        let shuffle = self.shuffle();
        // A linear model over sparse rows grows with their indices; a network's first layer is
        // as wide as the statistics pass found the rows (without "n_features").
        let grown_width = if network { self.stats_width } else { None };
        let width = first.map(|first| match self.config.layout {
            FeatureLayout::Dense { .. } => first.arena.n_features(),
            FeatureLayout::Sparse { n_features, .. } => {
                n_features.map(|n| n as usize).or(grown_width).unwrap_or(0)
            }
            FeatureLayout::Tabular => shuffle.rows().preprocessor().map_or(0, |p| p.n_features),
        });
        let Some(t) = team else {
            return Some(width.unwrap_or_else(|| self.no_rows(shuffle.counts().rows_skipped)));
        };
        match t.agree_on_width(width) {
            Some(w) => {
                if width.is_some_and(|mine| mine != w) {
                    raise(
                        PgSqlErrorCode::ERRCODE_ARRAY_ELEMENT_ERROR,
                        format!(
                            "rows of {} have feature arrays of {} and of {} elements",
                            self.config.relation,
                            w,
                            width.unwrap_or(0)
                        ),
                        Some("Every row's feature array must have the same length.".into()),
                    );
                }
                Some(w)
            }
            None if t.is_leader() => self.no_rows(shuffle.counts().rows_skipped),
            None => None,
        }
    }

    /// Each stored learner's trial: its model in the table's units (with patience, its best
    /// epoch's), its classes and what it read; or why it was set aside.
    unsafe fn trials(&self, finished: Vec<Finished<Learner, Model>>, ended: &Ended) -> Vec<Trial> {
        let searching = self.config.params.search.is_some();
        // Stored for dense arrays only: a column list's scaling is part of its preprocessing,
        // and a sparse model's (one scale per feature, maybe millions) is folded in and would
        // only bloat the catalog row.
        let preprocessing = self
            .shuffle()
            .rows()
            .preprocessor()
            .cloned()
            .map(std::rc::Rc::new);
        let dense = matches!(self.config.layout, FeatureLayout::Dense { .. });
        let stored_standardizer = ended
            .standardizer
            .filter(|_| dense)
            .map(|s| std::rc::Rc::new(serde_json::to_value(s).expect("standardizer serializes")));
        let mut trials = Vec::with_capacity(finished.len());
        for finished in finished {
            let Finished {
                configuration,
                group,
                result,
                seconds: trial_seconds,
                epochs,
                best,
                cv,
            } = finished;
            let (configuration, trial_params) = ended.configurations[configuration].clone();
            // A regression far worse than a zero model diverged while its loss stayed finite
            // (the shard coordinator's rule too): the ERROR, or a search's configuration set
            // aside.
            let result = self.check_diverged(
                result,
                &epochs,
                best.as_ref().map(|(epoch, _)| *epoch),
                searching,
                group.is_some(),
            );
            // A group's model: its key, and its rows (the last epoch's).
            let group = group.map(|g| ended.groups.expect("grouped").kept[g as usize].clone());
            let small_groups = match (ended.groups, &group) {
                (Some(found), None) => Some((found.small, found.small_rows)),
                _ => None,
            };
            let learner = match result {
                Ok(l) => l,
                Err(e) => {
                    trials.push(Trial {
                        configuration,
                        params: trial_params,
                        seconds: trial_seconds,
                        outcome: Err(e),
                        epochs_before_failing: epochs,
                        cv,
                        group,
                        small_groups,
                    });
                    continue;
                }
            };
            let mut model = learner.into_model();
            if let Some(s) = ended.standardizer {
                model = model.fold_standardizer(s);
            }
            // Early stopping keeps the best epoch's model (already in the table's units).
            let best_epoch = best.map(|(epoch, best_model)| {
                model = best_model;
                epoch
            });
            let classes = self.classes_of(ended.label_map, model.n_outputs());
            let rows_trained = match (&group, epochs.last()) {
                (Some(_), Some(last)) => last.stats.tuples,
                _ => ended.read.trained,
            };
            trials.push(Trial {
                configuration,
                params: trial_params,
                seconds: trial_seconds,
                outcome: Ok(TrainOutcome {
                    model,
                    classes,
                    standardizer: stored_standardizer.clone(),
                    preprocessing: preprocessing.clone(),
                    statistics_seconds: ended.statistics_seconds,
                    rows_trained,
                    rows_skipped: ended.read.skipped,
                    epochs,
                    best_epoch,
                    inference: None,
                    // Profiled once the model is final (see `profile_predictions`).
                    predictions: None,
                    seconds: ended.started.elapsed().as_secs_f64(),
                }),
                epochs_before_failing: Vec::new(),
                cv,
                group,
                small_groups,
            });
        }
        trials
    }

    /// A classifier's rows hold one class only.
    pub(super) fn one_class(&self) -> ! {
        raise(
            PgSqlErrorCode::ERRCODE_DATA_EXCEPTION,
            format!(
                "the label column of {} has only one distinct value",
                self.config.relation
            ),
            Some("Classifiers need rows of at least two classes.".into()),
        );
    }

    /// The label values of the model's classes.
    unsafe fn classes_of(
        &self,
        label_map: Option<(f64, f64)>,
        n_outputs: usize,
    ) -> Vec<ClassValue> {
        let dictionary = &self.shuffle().rows().classes().classes;
        match self.config.model.labels() {
            Labels::Number => Vec::new(),
            Labels::Classes => dictionary.iter().take(n_outputs).cloned().collect(),
            Labels::TwoClasses => {
                let (neg, pos) = label_map.expect("two labels were checked after epoch 1");
                if self.config.label.uses_classes() {
                    vec![
                        dictionary[neg as usize].clone(),
                        dictionary[pos as usize].clone(),
                    ]
                } else {
                    vec![ClassValue::Number(neg), ClassValue::Number(pos)]
                }
            }
        }
    }
}

/// A parallel worker's copy of the warm start's model (the leader's, sent as its parts) that
/// makes no model: out of memory, or a bug (the leader's own model always has its shape).
fn raise_warm_start_parts(e: PartsError) -> ! {
    match e {
        PartsError::OutOfMemory { bytes } => raise(
            PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
            format!(
                "out of memory for the \"warm_start\" model in a parallel worker ({bytes} bytes)"
            ),
            Some("Train with fewer \"workers\", or raise the memory the server may use.".into()),
        ),
        PartsError::BadShape(why) => raise(
            PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("a parallel worker received the \"warm_start\" model malformed: {why}"),
            None,
        ),
    }
}
