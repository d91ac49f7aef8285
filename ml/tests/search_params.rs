//! The search params (`search`, `search_trials`, `select_by`): what they accept and refuse, and
//! the configurations they describe, each parsed as its own training's params.

use corgipile_ml::model::ModelKind;
use corgipile_ml::params::search::SelectBy;
use corgipile_ml::params::{ParamError, TrainParams, Validation};
use serde_json::{json, Value};

fn for_kind(v: Value, kind: ModelKind) -> Result<TrainParams, ParamError> {
    TrainParams::for_kind(&v, kind)
}

fn refused(v: Value, kind: ModelKind) -> String {
    for_kind(v.clone(), kind)
        .expect_err(&format!("{v} should be refused"))
        .message
}

#[test]
fn a_grid_of_learning_rates_and_l2() {
    let p = for_kind(
        json!({"name": "m", "seed": 4, "epochs": 3,
               "search": {"learning_rate": [0.001, 0.01, 0.1], "l2": [0, 0.0001]}}),
        ModelKind::Logistic,
    )
    .unwrap();
    // Searching holds out 20% of the rows by default, to score the configurations.
    assert_eq!(p.validation, Some(Validation::Fraction(0.2)));
    assert_eq!(p.n_configurations(), 6);
    assert_eq!(p.selection(ModelKind::Logistic), SelectBy::Accuracy);
    let configs = p.configurations(ModelKind::Logistic).unwrap();
    assert_eq!(configs.len(), 6);
    for (chosen, params) in &configs {
        assert_eq!(
            params.learning_rate,
            chosen["learning_rate"].as_f64().unwrap()
        );
        assert_eq!(params.l2, chosen["l2"].as_f64().unwrap());
        // What they share: the other params, the seed and the validation rows; no search.
        assert_eq!((params.epochs, params.seed), (3, Some(4)));
        assert_eq!(params.validation, Some(Validation::Fraction(0.2)));
        assert!(params.search.is_none());
        assert!(params.to_json().get("search").is_none());
    }
}

#[test]
fn a_network_configuration_takes_the_defaults_of_its_own_optimizer() {
    let p = for_kind(
        json!({"name": "m", "search": {"optimizer": ["adam", "sgd"], "hidden": [[8], [16, 4]]}}),
        ModelKind::Mlp,
    )
    .unwrap();
    let configs = p.configurations(ModelKind::Mlp).unwrap();
    assert_eq!(configs.len(), 4);
    for (chosen, params) in &configs {
        let rate = if chosen["optimizer"] == "sgd" {
            0.01
        } else {
            0.001
        };
        assert_eq!(params.learning_rate, rate, "{chosen:?}");
        assert_eq!(json!(params.hidden), chosen["hidden"]);
    }
}

#[test]
fn a_sample_of_the_grid() {
    let p = for_kind(
        json!({"name": "m", "seed": 1, "search_trials": 3,
               "search": {"learning_rate": [0.001, 0.01, 0.1], "l2": [0, 0.001, 0.01]}}),
        ModelKind::Svm,
    )
    .unwrap();
    assert_eq!(p.n_configurations(), 3);
    assert_eq!(p.configurations(ModelKind::Svm).unwrap().len(), 3);
}

#[test]
fn stored_params_of_a_training_that_does_not_search_are_unchanged() {
    let p = for_kind(json!({}), ModelKind::Logistic).unwrap();
    let stored = p.to_json();
    for key in ["search", "search_trials", "select_by"] {
        assert!(stored.get(key).is_none(), "{key} listed: {stored}");
    }
    assert_eq!(p.n_configurations(), 1);
    assert_eq!(p.configurations(ModelKind::Logistic).unwrap().len(), 1);
}

#[test]
fn refused_searches() {
    let lr = json!({"learning_rate": [0.1, 0.01]});
    let m = |extra: Value| {
        let mut v = json!({"name": "m", "search": lr});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    assert!(refused(json!({"search": lr}), ModelKind::Svm).contains("needs \"name\""));
    // Parallel workers train every configuration on their shares.
    assert!(for_kind(m(json!({"workers": 1})), ModelKind::Svm).is_ok());
    // The kind is searched among those reading the label alike.
    let kinds = |k: Value| json!({"name": "m", "search": {"model": k}});
    assert!(for_kind(kinds(json!(["svm", "logistic"])), ModelKind::Logistic).is_ok());
    assert!(for_kind(
        kinds(json!(["linear", "mlp_regression"])),
        ModelKind::Linear
    )
    .is_ok());
    assert!(
        refused(kinds(json!(["svm", "linear"])), ModelKind::Svm).contains("cannot be \"linear\"")
    );
    assert!(refused(kinds(json!([1])), ModelKind::Svm).contains("cannot be 1"));
    assert!(for_kind(kinds(json!(["softmax", "mlp"])), ModelKind::Mlp).is_ok());
    assert!(refused(m(json!({"tolerance": 0.01})), ModelKind::Svm).contains("\"tolerance\""));
    assert!(refused(json!({"search_trials": 2}), ModelKind::Svm).contains("need \"search\""));
    assert!(refused(json!({"select_by": "loss"}), ModelKind::Svm).contains("need \"search\""));
    assert!(refused(m(json!({"select_by": "r2"})), ModelKind::Svm).contains("for regression"));
    assert!(
        refused(m(json!({"select_by": "accuracy"})), ModelKind::Linear).contains("classifiers")
    );
    assert!(refused(m(json!({"select_by": "auc"})), ModelKind::Svm).contains("unknown score"));
    assert!(refused(m(json!({"select_by": "f1"})), ModelKind::Softmax).contains("two-class"));
    assert!(refused(m(json!({"select_by": "roc_auc"})), ModelKind::Linear).contains("two-class"));
    assert!(refused(m(json!({"select_by": "log_loss"})), ModelKind::Svm).contains("probabilities"));
    assert!(refused(
        m(json!({"select_by": "log_loss"})),
        ModelKind::MlpRegression
    )
    .contains("probabilities"));
    for (score, kind) in [
        ("f1", ModelKind::Svm),
        ("roc_auc", ModelKind::Logistic),
        ("log_loss", ModelKind::Logistic),
        ("log_loss", ModelKind::Softmax),
        ("log_loss", ModelKind::Mlp),
    ] {
        let p = for_kind(m(json!({ "select_by": score })), kind).unwrap();
        assert_eq!(p.selection(kind).name(), score);
    }
    assert!(refused(m(json!({"search_trials": 0})), ModelKind::Svm).contains("search_trials"));
    // Each value is checked as its param, and the error names the search.
    let bad = refused(
        json!({"name": "m", "search": {"learning_rate": [0.1, -1]}}),
        ModelKind::Svm,
    );
    assert!(
        bad.starts_with("in \"search\": ") && bad.contains("learning_rate"),
        "{bad}"
    );
    let net = refused(
        json!({"name": "m", "search": {"hidden": [[8]]}}),
        ModelKind::Logistic,
    );
    assert!(net.contains("\"hidden\" applies to mlp"), "{net}");
    let l1 = refused(
        json!({"name": "m", "search": {"l1": [0, 0.1]}}),
        ModelKind::Mlp,
    );
    assert!(l1.contains("\"l1\" cannot be used"), "{l1}");
    let epochs = refused(
        json!({"name": "m", "search": {"epochs": [1, 2]}}),
        ModelKind::Svm,
    );
    assert!(epochs.contains("cannot be searched"), "{epochs}");
}

#[test]
fn a_given_validation_is_kept() {
    let p = for_kind(
        json!({"name": "m", "validation": {"predicate": "id % 3 = 0"}, "search": {"l2": [0, 1]}}),
        ModelKind::Linear,
    )
    .unwrap();
    assert_eq!(
        p.validation,
        Some(Validation::Predicate("id % 3 = 0".into()))
    );
    assert_eq!(p.selection(ModelKind::Linear), SelectBy::R2);
    for (_, c) in p.configurations(ModelKind::Linear).unwrap() {
        assert_eq!(c.validation, p.validation);
    }
}

#[test]
fn group_params_what_they_accept_and_refuse() {
    let p = for_kind(
        json!({"name": "m", "group_by": "store"}),
        ModelKind::Logistic,
    )
    .unwrap();
    assert_eq!(p.group_by, Some(vec!["store".to_string()]));
    assert_eq!(p.min_group_rows, Some(100), "filled in");
    let stored = p.to_json();
    assert_eq!(stored["group_by"], json!(["store"]));
    assert_eq!(stored["min_group_rows"], 100);
    assert_eq!(TrainParams::from_json(&stored).unwrap(), p);
    let two = for_kind(
        json!({"name": "m", "group_by": ["a", "b"], "min_group_rows": 5}),
        ModelKind::Mlp,
    )
    .unwrap();
    assert_eq!(two.group_by.as_ref().map(Vec::len), Some(2));
    assert_eq!(two.min_group_rows, Some(5));
    // Not listed by a training without groups.
    let plain = for_kind(json!({}), ModelKind::Logistic).unwrap().to_json();
    assert!(plain.get("group_by").is_none() && plain.get("min_group_rows").is_none());

    let g = |extra: Value| {
        let mut v = json!({"name": "m", "group_by": "store"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    assert!(refused(json!({"group_by": "s"}), ModelKind::Svm).contains("needs \"name\""));
    assert!(refused(json!({"min_group_rows": 3}), ModelKind::Svm).contains("needs \"group_by\""));
    assert!(for_kind(g(json!({"workers": 2})), ModelKind::Svm).is_ok());
    for key in ["search", "folds", "validation", "tolerance"] {
        let value = match key {
            "search" => json!({"l2": [0, 1]}),
            "folds" => json!(3),
            "validation" => json!({"fraction": 0.1}),
            _ => json!(0.01),
        };
        let e = refused(g(json!({ key: value })), ModelKind::Svm);
        assert!(
            e.contains(&format!("\"{key}\"")) && e.contains("yet"),
            "{key}: {e}"
        );
    }
    for bad in [
        json!([]),
        json!(["a", "a"]),
        json!(""),
        json!(7),
        json!(["a", "b", "c", "d", "e", "f", "g", "h", "i"]),
    ] {
        assert!(
            refused(g(json!({ "group_by": bad })), ModelKind::Svm).contains("group_by"),
            "{bad}"
        );
    }
    assert!(refused(g(json!({"min_group_rows": 0})), ModelKind::Svm).contains("min_group_rows"));
}
