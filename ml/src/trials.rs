//! Models trained side by side on the same shuffled buffers: one [`Learner`] per configuration
//! of a search (one alone for an ordinary training). Reading and shuffling the table is the
//! costly part of an epoch; every buffer, once shuffled, goes through every learner in turn.
//!
//! With several learners, one that diverges is set aside (its error kept, for the report) and
//! the others go on; with one, or when the last one diverges, the error is the training's, as
//! for a learner alone. Any other error (an interrupt, memory) stops them all.

use std::time::Instant;

use crate::arena::TupleArena;
use crate::learner::Learner;
use crate::trained::Model;
use crate::trainer::{EpochStats, InterruptCheck, TrainError};

/// Where a learner is: training, done early (see [`Trials::stop`]), or set aside.
enum State {
    Going,
    Stopped,
    Failed(TrainError),
}

struct Trial {
    learner: Learner,
    state: State,
    /// Seconds spent training it (its share of the arithmetic; the scan is shared).
    seconds: f64,
}

impl Trial {
    fn is_going(&self) -> bool {
        matches!(self.state, State::Going)
    }
}

pub struct Trials {
    trials: Vec<Trial>,
}

impl Trials {
    pub fn new(learners: Vec<Learner>) -> Trials {
        assert!(!learners.is_empty(), "at least one learner trains");
        Trials {
            trials: learners
                .into_iter()
                .map(|learner| Trial {
                    learner,
                    state: State::Going,
                    seconds: 0.0,
                })
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.trials.len()
    }

    pub fn is_empty(&self) -> bool {
        self.trials.is_empty()
    }

    /// The one learner of a training that is not a search (parallel workers, shards).
    pub fn only(&mut self) -> &mut Learner {
        assert_eq!(self.trials.len(), 1, "a search trains in one process");
        &mut self.trials[0].learner
    }

    /// Each learner gets its own check, made by `make`.
    pub fn set_interrupt(&mut self, mut make: impl FnMut() -> InterruptCheck) {
        for t in &mut self.trials {
            t.learner.set_interrupt(Some(make()));
        }
    }

    /// Learner `i` trains no more (early stopping): it keeps its model as it is now.
    pub fn stop(&mut self, i: usize) {
        if matches!(self.trials[i].state, State::Going) {
            self.trials[i].state = State::Stopped;
        }
    }

    pub fn start_epoch(&mut self, epoch: u32) {
        for t in self.trials.iter_mut().filter(|t| t.is_going()) {
            t.learner.start_epoch(epoch);
        }
    }

    /// Sets aside a learner that diverged, unless it is the last one going: then its error is
    /// the training's.
    fn settle(&mut self, i: usize, result: Result<(), TrainError>) -> Result<(), TrainError> {
        match result {
            Ok(()) => Ok(()),
            Err(e @ TrainError::Diverged { .. }) if self.going() > 1 => {
                self.trials[i].state = State::Failed(e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// How many learners are still training.
    fn going(&self) -> usize {
        self.trials.iter().filter(|t| t.is_going()).count()
    }

    /// Trains every learner still going on the buffer, in the same order.
    pub fn train_buffer(
        &mut self,
        arena: &TupleArena,
        order: Option<&[u32]>,
    ) -> Result<(), TrainError> {
        for i in 0..self.trials.len() {
            let t = &mut self.trials[i];
            if !t.is_going() {
                continue;
            }
            let started = Instant::now();
            let result = t.learner.train_buffer(arena, order);
            t.seconds += started.elapsed().as_secs_f64();
            self.settle(i, result)?;
        }
        Ok(())
    }

    /// Ends the epoch of every learner: its statistics, None for one not going.
    pub fn finish_epoch(&mut self) -> Result<Vec<Option<EpochStats>>, TrainError> {
        let mut stats = Vec::with_capacity(self.trials.len());
        for i in 0..self.trials.len() {
            if !self.trials[i].is_going() {
                stats.push(None);
                continue;
            }
            match self.trials[i].learner.finish_epoch() {
                Ok(s) => stats.push(Some(s)),
                Err(e) => {
                    self.settle(i, Err(e))?;
                    stats.push(None);
                }
            }
        }
        Ok(stats)
    }

    /// The first learner still going (they all saw the same labels).
    fn first_going(&self) -> &Learner {
        let t = self
            .trials
            .iter()
            .find(|t| !matches!(t.state, State::Failed(_)));
        &t.unwrap_or(&self.trials[0]).learner
    }

    /// Two-class kinds: the distinct raw label values seen (see [`Learner::labels_seen`]).
    pub fn labels_seen(&self) -> Vec<f64> {
        self.first_going().labels_seen()
    }

    /// Two-class kinds: the (negative, positive) raw label values.
    pub fn label_map(&self) -> Option<(f64, f64)> {
        self.first_going().label_map()
    }

    /// The model each learner going would return now (None for the others), or Err with the
    /// bytes of the one that could not be copied.
    pub fn result_models(&mut self) -> Result<Vec<Option<Model>>, u64> {
        let mut models = Vec::with_capacity(self.trials.len());
        for t in &mut self.trials {
            if !t.is_going() {
                models.push(None);
                continue;
            }
            match t.learner.result_model() {
                Some(m) => models.push(Some(m)),
                None => return Err(t.learner.n_params() as u64 * 8),
            }
        }
        Ok(models)
    }

    /// Every learner's trained model or why it was set aside, and its seconds of training.
    pub fn into_results(self) -> Vec<(Result<Learner, TrainError>, f64)> {
        self.trials
            .into_iter()
            .map(|t| {
                let result = match t.state {
                    State::Failed(e) => Err(e),
                    State::Going | State::Stopped => Ok(t.learner),
                };
                (result, t.seconds)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelKind;
    use crate::params::TrainParams;
    use serde_json::json;

    /// 400 rows of 3 features, labelled by a hyperplane.
    fn rows() -> TupleArena {
        let mut arena = TupleArena::new(3, 400);
        let mut s = 7u64;
        for _ in 0..400 {
            let mut x = [0.0; 3];
            for v in &mut x {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v = (s >> 33) as f64 / 2f64.powi(31) * 20.0 - 10.0;
            }
            arena.push(
                if x[0] - 2.0 * x[1] + 0.5 > 0.0 {
                    1.0
                } else {
                    0.0
                },
                &x,
            );
        }
        arena
    }

    fn learner(kind: ModelKind, params: serde_json::Value) -> Learner {
        let p = TrainParams::for_kind(&params, kind).unwrap();
        Learner::linear(p.train_config(kind), 3).unwrap()
    }

    fn weights(model: &Model) -> Vec<u64> {
        match model {
            Model::Linear(m) => m
                .weights
                .iter()
                .chain(&m.bias)
                .map(|w| w.to_bits())
                .collect(),
            Model::Network(_) => unreachable!(),
        }
    }

    fn train(trials: &mut Trials, arena: &TupleArena, epochs: u32) -> Result<(), TrainError> {
        for epoch in 1..=epochs {
            trials.start_epoch(epoch);
            trials.train_buffer(arena, None)?;
            trials.finish_epoch()?;
        }
        Ok(())
    }

    #[test]
    fn side_by_side_each_learner_is_what_it_would_be_alone() {
        let arena = rows();
        let configs = [
            json!({"learning_rate": 0.1}),
            json!({"learning_rate": 0.01, "l2": 0.001}),
        ];
        let mut together = Trials::new(
            configs
                .iter()
                .map(|c| learner(ModelKind::Logistic, c.clone()))
                .collect(),
        );
        train(&mut together, &arena, 3).unwrap();
        let models = together.result_models().unwrap();
        for (config, model) in configs.iter().zip(&models) {
            let mut alone = Trials::new(vec![learner(ModelKind::Logistic, config.clone())]);
            train(&mut alone, &arena, 3).unwrap();
            let alone = alone.result_models().unwrap().remove(0).unwrap();
            assert_eq!(
                weights(model.as_ref().unwrap()),
                weights(&alone),
                "{config}"
            );
        }
        assert_ne!(
            weights(models[0].as_ref().unwrap()),
            weights(models[1].as_ref().unwrap())
        );
    }

    #[test]
    fn a_diverging_learner_is_set_aside_unless_it_is_the_last() {
        let arena = rows();
        // Raw features of ±10 with a huge step: the linear regression's weights overflow.
        let wild = json!({"learning_rate": 1e6, "average": false});
        let mut two = Trials::new(vec![
            learner(ModelKind::Linear, wild.clone()),
            learner(ModelKind::Linear, json!({"learning_rate": 0.001})),
        ]);
        train(&mut two, &arena, 3).unwrap();
        let results = two.into_results();
        assert!(matches!(results[0].0, Err(TrainError::Diverged { .. })));
        assert!(results[1].0.is_ok());

        let mut alone = Trials::new(vec![learner(ModelKind::Linear, wild)]);
        assert!(matches!(
            train(&mut alone, &arena, 3),
            Err(TrainError::Diverged { .. })
        ));
    }
}
