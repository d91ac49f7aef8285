//! Fit: the plan, the end of an epoch (patience, stopping, set aside elsewhere, NOTICEs), the
//! finish (folds gathered), and a whole search with folds driven over in-memory rows.

use super::*;
use crate::learner::Learner;
use crate::model::ModelKind;
use crate::params::TrainParams;
use crate::test_rows::{epoch_stats as stats, hyperplane_rows as rows};
use crate::trials::Trials;
use serde_json::json;

fn validation(loss: f64) -> ValidationStats {
    ValidationStats {
        loss,
        accuracy: Some(0.5),
        rows: 100,
        ..ValidationStats::empty()
    }
}

/// Every learner's end of `epoch`, with these training and validation losses (None: it did
/// not train), snapshots named after the learner and the epoch.
fn end(epoch: u32, losses: &[Option<(f64, Option<f64>)>]) -> EpochEnd<String> {
    EpochEnd {
        epoch,
        stats: losses
            .iter()
            .map(|l| l.map(|(loss, _)| stats(epoch, loss)))
            .collect(),
        snapshots: (0..losses.len())
            .map(|i| Some(format!("learner {i} epoch {epoch}")))
            .collect(),
        validations: losses
            .iter()
            .map(|l| l.and_then(|(_, v)| v).map(validation))
            .collect(),
        seconds: 1.0,
        validation_seconds: 0.25,
    }
}

/// Two configurations, each with two folds before its model of every row.
fn search_with_folds() -> LearnerPlan {
    LearnerPlan {
        configuration: vec![0, 0, 0, 1, 1, 1],
        fold: vec![Some(0), Some(1), None, Some(0), Some(1), None],
        group: vec![None; 6],
    }
}

fn configurations() -> Vec<Configuration> {
    [0.1, 0.01]
        .iter()
        .map(|lr| {
            let values = json!({ "learning_rate": lr });
            let params = TrainParams::for_kind(&values, ModelKind::Logistic).unwrap();
            (values.as_object().unwrap().clone(), params)
        })
        .collect()
}

#[test]
fn patience_stops_a_learner_and_keeps_its_best_epoch() {
    let mut fit: Fit<String> = Fit::new(
        LearnerPlan::one(),
        0.0,
        &[Some(Patience::Epochs(1))],
        Notices::quiet(9),
    );
    let a = fit.end_epoch(end(1, &[Some((0.9, Some(0.5)))]));
    assert_eq!((a.stop.len(), a.done), (0, false));
    let a = fit.end_epoch(end(2, &[Some((0.8, Some(0.4)))]));
    assert!(a.stop.is_empty());
    let a = fit.end_epoch(end(3, &[Some((0.7, Some(0.45)))]));
    assert_eq!(a.stop, vec![0]);
    assert!(a.done);
    let finished = fit.finish(vec![(Ok("trainer"), 2.0)], Vec::new());
    assert_eq!(finished.len(), 1);
    let f = &finished[0];
    assert_eq!(f.epochs.len(), 3);
    assert_eq!(f.epochs[1].validation.as_ref().unwrap().loss, 0.4);
    assert_eq!(f.epochs[2].validation_seconds, 0.25);
    assert_eq!(f.best, Some((2, "learner 0 epoch 2".to_string())));
    assert_eq!(f.seconds, 2.0);
    assert!(f.cv.is_empty());
}

#[test]
fn tolerance_stops_each_learner_on_its_own_and_the_training_when_all_are_done() {
    let plan = LearnerPlan {
        configuration: vec![0, 1],
        fold: vec![None, None],
        group: vec![None, None],
    };
    let mut fit: Fit<String> = Fit::new(plan, 0.01, &[None, None], Notices::quiet(9));
    fit.end_epoch(end(1, &[Some((0.5, None)), Some((0.5, None))]));
    let a = fit.end_epoch(end(2, &[Some((0.499, None)), Some((0.3, None))]));
    assert_eq!((a.stop, a.done), (vec![0], false));
    // A stopped learner has no statistics: nothing is recorded, nothing more to stop.
    let a = fit.end_epoch(end(3, &[None, Some((0.295, None))]));
    assert_eq!((a.stop, a.done), (vec![1], true));
    let finished = fit.finish(vec![(Ok(()), 1.0), (Ok(()), 1.0)], Vec::new());
    let epochs: Vec<usize> = finished.iter().map(|f| f.epochs.len()).collect();
    assert_eq!(epochs, vec![2, 3]);
    assert!(finished.iter().all(|f| f.best.is_none()));
}

#[test]
fn a_learner_set_aside_in_another_process_stops_here_and_ends_diverged() {
    let plan = LearnerPlan {
        configuration: vec![0, 1],
        fold: vec![None, None],
        group: vec![None, None],
    };
    let mut fit: Fit<String> = Fit::new(plan, 0.0, &[None, None], Notices::quiet(3));
    fit.end_epoch(end(1, &[Some((0.5, None)), Some((0.5, None))]));
    // Epoch 2: learner 1 diverged in another process; the pooled statistics say None.
    fit.set_aside_elsewhere(1, 2);
    let a = fit.end_epoch(end(2, &[Some((0.4, None)), None]));
    assert_eq!((a.stop, a.done), (vec![1], false));
    // Asked once: it is done now.
    let a = fit.end_epoch(end(3, &[Some((0.3, None)), None]));
    assert!(a.stop.is_empty());
    let finished = fit.finish(vec![(Ok(()), 1.0), (Ok(()), 1.0)], Vec::new());
    assert!(finished[0].result.is_ok());
    assert!(matches!(
        finished[1].result,
        Err(TrainError::Diverged { epoch: 2 })
    ));
    assert_eq!(finished[1].epochs.len(), 1);
}

#[test]
fn the_folds_scores_and_seconds_go_to_their_configurations_model() {
    let fit: Fit<String> = Fit::new(search_with_folds(), 0.0, &[None, None], Notices::quiet(1));
    let results = (0..6).map(|i| (Ok(i), 1.0 + i as f64)).collect();
    let holdouts = vec![
        Some(validation(0.1)),
        None, // set aside
        None,
        Some(validation(0.3)),
        Some(validation(0.4)),
        None,
    ];
    let finished = fit.finish(results, holdouts);
    assert_eq!(finished.len(), 2);
    assert_eq!(finished[0].configuration, 0);
    assert!(matches!(finished[0].result, Ok(2)));
    assert_eq!(finished[0].seconds, 1.0 + 2.0 + 3.0);
    let cv: Vec<Option<f64>> = finished[0]
        .cv
        .iter()
        .map(|v| v.as_ref().map(|v| v.loss))
        .collect();
    assert_eq!(cv, vec![Some(0.1), None]);
    assert_eq!(finished[1].configuration, 1);
    assert!(matches!(finished[1].result, Ok(5)));
    assert_eq!(finished[1].seconds, 4.0 + 5.0 + 6.0);
    assert_eq!(finished[1].cv.len(), 2);
}

#[test]
fn notices_a_table_for_one_model_a_line_for_a_search_and_for_groups() {
    let table = Notices {
        verbose: true,
        epochs: 2,
        metric: "accuracy",
        search: None,
        groups: None,
    };
    let mut fit: Fit<String> = Fit::new(LearnerPlan::one(), 0.0, &[None], table.clone());
    let a = fit.end_epoch(end(1, &[Some((0.5, Some(0.6)))]));
    assert_eq!(a.notices.len(), 2);
    assert!(a.notices[0].contains("valid loss"), "{}", a.notices[0]);
    assert!(a.notices[1].contains("1/2"), "{}", a.notices[1]);
    let a = fit.end_epoch(end(2, &[Some((0.4, Some(0.5)))]));
    assert_eq!(a.notices.len(), 1);

    // Quiet: nothing.
    let mut fit: Fit<String> = Fit::new(
        LearnerPlan::one(),
        0.0,
        &[None],
        Notices {
            verbose: false,
            ..table.clone()
        },
    );
    assert!(fit
        .end_epoch(end(1, &[Some((0.5, None))]))
        .notices
        .is_empty());

    // A search: one line per epoch naming the best configuration on validation (the folds'
    // learners are not in it).
    let search = Notices {
        search: Some((configurations(), SelectBy::Loss)),
        ..table.clone()
    };
    let mut fit: Fit<String> = Fit::new(search_with_folds(), 0.0, &[None, None], search);
    let losses = [
        Some((0.5, Some(0.01))), // a fold's: not a configuration's score
        Some((0.5, Some(0.01))),
        Some((0.5, Some(0.4))),
        Some((0.5, None)),
        Some((0.5, None)),
        Some((0.5, Some(0.2))),
    ];
    let a = fit.end_epoch(end(1, &losses));
    assert_eq!(a.notices.len(), 1);
    assert!(
        a.notices[0]
            .starts_with("epoch 1/2: 2 of 2 configurations trained; best validation loss 0.2000"),
        "{}",
        a.notices[0]
    );
    assert!(a.notices[0].contains("0.01"), "{}", a.notices[0]);

    // Groups: the table of the model of every row, then how many group models train.
    let plan = LearnerPlan {
        configuration: vec![0, 0, 0],
        fold: vec![None; 3],
        group: vec![None, Some(0), Some(1)],
    };
    let groups = Notices {
        groups: Some(2),
        ..table
    };
    let mut fit: Fit<String> = Fit::new(plan, 0.01, &[None], groups);
    fit.end_epoch(end(
        1,
        &[Some((0.5, None)), Some((0.5, None)), Some((0.5, None))],
    ));
    let a = fit.end_epoch(end(
        2,
        &[Some((0.3, None)), Some((0.499, None)), Some((0.3, None))],
    ));
    assert_eq!(a.stop, vec![1]);
    assert_eq!(a.notices.len(), 2);
    assert_eq!(
        a.notices[1],
        "epoch 2/2: the model of every row and 1 of 2 group models trained"
    );
}

/// A search of two learning rates with two folds each, driven as the backend drives it over
/// buffers of in-memory rows: every learner trains every epoch, the folds score their rows in
/// the last, and each configuration ends with its model of every row and its two folds' scores.
#[test]
fn a_search_with_folds_over_in_memory_rows() {
    let arena = rows(600);
    let configurations = configurations();
    let plan = search_with_folds();
    let learners = plan
        .configuration
        .iter()
        .zip(&plan.fold)
        .map(|(&c, &fold)| {
            let config = configurations[c].1.train_config(ModelKind::Logistic);
            (Learner::linear(config, 3).unwrap(), fold)
        })
        .collect();
    let mut trials = Trials::with_folds(learners, 2);
    let epochs = 4;
    let mut fit: Fit<()> = Fit::new(plan, 0.0, &[None, None], Notices::quiet(epochs));
    for epoch in 1..=epochs {
        if epoch == epochs {
            trials.score_holdouts(None);
        }
        trials.start_epoch(epoch);
        trials.train_buffer(&arena, None).unwrap();
        let stats = trials.finish_epoch().unwrap();
        let n = stats.len();
        let actions = fit.end_epoch(EpochEnd {
            epoch,
            stats,
            snapshots: vec![None; n],
            validations: vec![None; n],
            seconds: 0.1,
            validation_seconds: 0.0,
        });
        assert!(actions.stop.is_empty() && !actions.done);
    }
    let holdouts = trials
        .take_holdout_scores()
        .into_iter()
        .map(|s| s.map(|s| s.finish()))
        .collect();
    let finished = fit.finish(trials.into_results(), holdouts);
    assert_eq!(finished.len(), 2);
    for (c, f) in finished.iter().enumerate() {
        assert_eq!(f.configuration, c);
        assert_eq!(f.epochs.len(), epochs as usize);
        assert!(f.result.is_ok());
        assert_eq!(f.cv.len(), 2);
        let scored: u64 = f.cv.iter().map(|v| v.as_ref().unwrap().rows).sum();
        assert_eq!(scored, 600, "each row is held out by one fold");
        let accuracy = f.cv[0].as_ref().unwrap().accuracy.unwrap();
        assert!(
            accuracy > 0.9,
            "configuration {c}: held-out accuracy {accuracy}"
        );
    }
}
