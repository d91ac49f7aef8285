//! Trials: side by side = alone, folds, groups, threads, divergence.

use super::*;
use crate::model::ModelKind;
use crate::params::TrainParams;
use serde_json::json;

/// 400 rows of 3 features, labelled by a hyperplane.
fn rows() -> TupleArena {
    many_rows(400)
}

/// `n` rows of 3 features, labelled by a hyperplane.
fn many_rows(n: usize) -> TupleArena {
    crate::test_rows::hyperplane_rows(n)
}

fn learner(kind: ModelKind, params: serde_json::Value) -> Learner {
    let p = TrainParams::for_kind(&params, kind).unwrap();
    Learner::linear(p.train_config(kind), 3).unwrap()
}

fn weights(model: &Model) -> Vec<u64> {
    let m = model.as_linear().expect("a linear model");
    m.weights
        .iter()
        .chain(&m.bias)
        .map(|w| w.to_bits())
        .collect()
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

fn models(trials: &mut Trials) -> Vec<Vec<u64>> {
    trials
        .result_models()
        .unwrap()
        .iter()
        .map(|m| weights(m.as_ref().unwrap()))
        .collect()
}

#[test]
fn a_rows_fold_is_fixed_and_the_folds_about_equal() {
    let arena = rows();
    let folds: Vec<usize> = (0..arena.len())
        .map(|i| fold_of(arena.row(i), arena.label(i), 5))
        .collect();
    let again: Vec<usize> = (0..arena.len())
        .map(|i| fold_of(arena.row(i), arena.label(i), 5))
        .collect();
    assert_eq!(folds, again);
    for f in 0..5 {
        let n = folds.iter().filter(|&&x| x == f).count();
        assert!((50..110).contains(&n), "fold {f}: {n} of 400 rows");
    }
    let sparse = Row::Sparse {
        indices: &[1, 4],
        values: &[0.5, -2.0],
    };
    assert_eq!(fold_of(sparse, 1.0, 3), fold_of(sparse, 1.0, 3));
}

#[test]
fn a_fold_learner_is_the_learner_of_the_other_rows_alone() {
    let arena = rows();
    let config = json!({"learning_rate": 0.05});
    let mut cv = Trials::with_folds(
        (0..3)
            .map(|f| (learner(ModelKind::Logistic, config.clone()), Some(f)))
            .chain([(learner(ModelKind::Logistic, config.clone()), None)])
            .collect(),
        3,
    );
    train(&mut cv, &arena, 2).unwrap();
    let together = models(&mut cv);
    for (fold, model) in together.iter().enumerate().take(3) {
        let mut others = TupleArena::new(3, 400);
        for i in 0..arena.len() {
            if fold_of(arena.row(i), arena.label(i), 3) != fold {
                let Row::Dense(x) = arena.row(i) else {
                    unreachable!()
                };
                others.push(arena.label(i), x);
            }
        }
        let mut alone = Trials::new(vec![learner(ModelKind::Logistic, config.clone())]);
        train(&mut alone, &others, 2).unwrap();
        assert_eq!(model, &models(&mut alone)[0], "fold {fold}");
    }
    let mut all = Trials::new(vec![learner(ModelKind::Logistic, config)]);
    train(&mut all, &arena, 2).unwrap();
    assert_eq!(together[3], models(&mut all)[0], "the model of every row");
}

#[test]
fn a_group_learner_is_the_learner_of_its_groups_rows_alone() {
    let source = rows();
    let group_of = |i: usize| match i % 5 {
        0 | 1 => 0,
        2 => 1,
        3 => 2, // no learner of its own: trains only the model of every row
        _ => NO_GROUP,
    };
    let mut arena = TupleArena::new(3, 400);
    arena.set_grouped().unwrap();
    for i in 0..source.len() {
        let Row::Dense(x) = source.row(i) else {
            unreachable!()
        };
        arena.set_next_group(group_of(i));
        arena.push(source.label(i), x);
    }
    let config = json!({"learning_rate": 0.05, "batch_size": 3});
    let make = || learner(ModelKind::Logistic, config.clone());
    let mut grouped = Trials::with_groups(
        vec![(make(), None), (make(), Some(0)), (make(), Some(1))],
        2,
    );
    grouped.set_threads(2);
    train(&mut grouped, &arena, 3).unwrap();
    let together = models(&mut grouped);
    for (g, model) in [(0, &together[1]), (1, &together[2])] {
        let mut own = TupleArena::new(3, 400);
        for i in (0..source.len()).filter(|&i| group_of(i) == g) {
            let Row::Dense(x) = source.row(i) else {
                unreachable!()
            };
            own.push(source.label(i), x);
        }
        let mut alone = Trials::new(vec![make()]);
        train(&mut alone, &own, 3).unwrap();
        assert_eq!(model, &models(&mut alone)[0], "group {g}");
    }
    let mut all = Trials::new(vec![make()]);
    train(&mut all, &source, 3).unwrap();
    assert_eq!(together[0], models(&mut all)[0], "the model of every row");
}

#[test]
fn holdout_scores_are_the_fold_models_on_their_rows() {
    let arena = rows();
    let config = json!({"learning_rate": 0.0005});
    let mut cv = Trials::with_folds(
        (0..4)
            .map(|f| (learner(ModelKind::Linear, config.clone()), Some(f)))
            .collect(),
        4,
    );
    train(&mut cv, &arena, 1).unwrap();
    cv.score_holdouts(None);
    cv.start_epoch(2);
    cv.train_buffer(&arena, None).unwrap();
    let fold_models = cv.result_models().unwrap();
    let scores: Vec<Option<ValidationStats>> = cv
        .take_holdout_scores()
        .into_iter()
        .map(|s| s.map(ValidationScore::finish))
        .collect();
    for fold in 0..4 {
        // One buffer: scored by the model as it is after that buffer, the last one.
        let mut expected = ValidationScore::new(ModelKind::Linear, None);
        for i in 0..arena.len() {
            if fold_of(arena.row(i), arena.label(i), 4) == fold {
                expected.push(
                    fold_models[fold].as_ref().unwrap(),
                    arena.row(i),
                    arena.label(i),
                );
            }
        }
        let (got, want) = (scores[fold].as_ref().unwrap(), expected.finish());
        assert_eq!(
            (got.rows, got.loss.to_bits()),
            (want.rows, want.loss.to_bits()),
            "fold {fold}"
        );
        assert!(got.rows > 50);
    }
    let report = cross_validation(&scores);
    assert_eq!(report["folds"], 4);
    let r2: Vec<f64> = scores
        .iter()
        .map(|v| v.as_ref().unwrap().r2.unwrap())
        .collect();
    let mean = r2.iter().sum::<f64>() / 4.0;
    assert!(
        (report["r2"].as_f64().unwrap() - mean).abs() < 1e-12,
        "{report}"
    );
    assert!(report["r2_std"].as_f64().unwrap() >= 0.0);
}

#[test]
fn several_threads_train_the_same_models() {
    let arena = rows();
    let configs: Vec<_> = [0.2, 0.1, 0.05, 0.01, 0.001]
        .iter()
        .map(|lr| json!({"learning_rate": lr, "batch_size": 4}))
        .collect();
    let make = || {
        Trials::new(
            configs
                .iter()
                .map(|c| learner(ModelKind::Svm, c.clone()))
                .collect(),
        )
    };
    let (mut one, mut three) = (make(), make());
    three.set_threads(3);
    train(&mut one, &arena, 3).unwrap();
    train(&mut three, &arena, 3).unwrap();
    assert_eq!(models(&mut one), models(&mut three));
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

/// A permutation of 0 … n-1 drawn from `seed`.
fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut s = seed;
    for i in (1..n).rev() {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (s >> 33) as usize % (i + 1));
    }
    order
}

#[test]
fn linear_learners_trained_chunk_by_chunk_are_what_they_would_be_alone() {
    // 30,000 rows: a buffer cut into several chunks (see CHUNK_BYTES), mini-batches of 7 that
    // span chunks, folds, averaging, l1, two threads; rows as they are, and standardized once
    // per chunk for all the learners (they share one standardizer) rather than by each.
    let arena = many_rows(30_000);
    assert!(arena.len() > 2 * CHUNK_BYTES / (arena.bytes_used() / arena.len()));
    let order = shuffled(arena.len(), 5);
    let mut stats = crate::stats::FeatureStats::new(3, true);
    stats.push_arena(&arena, || true);
    let scaler = crate::trainer::normalizing_scaler(&stats, false, true);
    assert!(!scaler.is_identity());
    let configs = [
        json!({"learning_rate": 0.1}),
        json!({"learning_rate": 0.01, "batch_size": 7}),
        json!({"learning_rate": 0.03, "l1": 0.001, "average": false}),
    ];
    for scaling in [None, Some(&scaler)] {
        let learner = |config: &serde_json::Value| {
            let p = TrainParams::for_kind(config, ModelKind::Logistic).unwrap();
            let mut c = p.train_config(ModelKind::Logistic);
            c.standardizer = scaling.cloned();
            Learner::linear(c, 3).unwrap()
        };
        let make = |threads: usize| {
            let mut trials = Trials::with_folds(
                configs
                    .iter()
                    .flat_map(|c| [Some(0), Some(1), None].map(|fold| (learner(c), fold)))
                    .collect(),
                2,
            );
            trials.set_threads(threads);
            trials
        };
        let run = |trials: &mut Trials, order: &[u32]| {
            for epoch in 1..=2 {
                trials.start_epoch(epoch);
                trials.train_buffer(&arena, Some(order)).unwrap();
                trials.finish_epoch().unwrap();
            }
            models(trials)
        };
        let one_thread = run(&mut make(1), &order);
        assert_eq!(run(&mut make(2), &order), one_thread);
        // A fold's learner alone: the buffer's order without the fold's rows.
        let kept: Vec<u32> = order
            .iter()
            .copied()
            .filter(|&r| fold_of(arena.row(r as usize), arena.label(r as usize), 2) != 1)
            .collect();
        for (c, config) in configs.iter().enumerate() {
            // One learner trains on the whole buffer at once.
            let alone = run(&mut Trials::new(vec![learner(config)]), &order);
            assert_eq!(
                alone[0],
                one_thread[3 * c + 2],
                "{config}, scaled {}",
                scaling.is_some()
            );
            let fold = run(&mut Trials::new(vec![learner(config)]), &kept);
            assert_eq!(fold[0], one_thread[3 * c + 1], "{config}, fold 1");
        }
    }
}

/// A search of many folded linear learners, trained chunk by chunk: a stop raised during a
/// buffer ends it after little more work, for every learner at once. (Each learner's count of
/// work restarted at every chunk, so no learner ever asked, and the buffer ran to its end.)
#[test]
fn a_stop_ends_a_chunked_folded_search_within_a_checks_work() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let arena = many_rows(60_000);
    let order = shuffled(arena.len(), 3);
    let learners: Vec<(Learner, Option<usize>)> = (0..40)
        .flat_map(|c| {
            let config = json!({"learning_rate": 0.001 * (c + 1) as f64});
            (0..5).map(move |fold| (learner(ModelKind::Logistic, config.clone()), Some(fold)))
        })
        .collect();
    let mut trials = Trials::with_folds(learners, 5);
    let stop = Arc::new(AtomicBool::new(false));
    let checks = Arc::new(AtomicUsize::new(0));
    // The stop is raised at the 50th check (of any learner): well inside the buffer.
    trials.set_interrupt(|| {
        let (stop, checks) = (stop.clone(), checks.clone());
        Box::new(move || {
            if checks.fetch_add(1, Ordering::Relaxed) == 50 {
                stop.store(true, Ordering::Relaxed);
            }
            stop.load(Ordering::Relaxed)
        })
    });
    trials.start_epoch(1);
    let result = trials.train_buffer(&arena, Some(&order));
    assert!(matches!(result, Err(TrainError::Interrupted)), "{result:?}");
    // The whole buffer is 200 learners × 48,000 rows × 4: about 150 checks' work.
    let asked = checks.load(Ordering::Relaxed);
    assert!(
        asked == 51,
        "asked {asked} times: every learner went on to its own check"
    );
}
