//! Parameter parsing, validation, serialization and resolution (sizes: params_sizing.rs).

use corgipile_ml::params::{
    BlockSize, BufferSize, ClassWeight, Features, ParamError, ScheduleKind, ShuffleMode,
    TrainParams, Validation,
};
use corgipile_ml::trainer::LrSchedule;
use serde_json::{json, Value};

fn parse(v: Value) -> Result<TrainParams, ParamError> {
    TrainParams::from_json(&v)
}

fn err(v: Value) -> ParamError {
    parse(v.clone()).expect_err(&format!("{v} should be rejected"))
}

#[test]
fn defaults() {
    let p = parse(json!({})).unwrap();
    assert_eq!(p, TrainParams::defaults());
    assert_eq!(p.features, Features::Column("features".into()));
    assert_eq!(p.learning_rate_schedule, ScheduleKind::Exponential);
    assert_eq!(p.l1, 0.0);
    assert!(p.fit_intercept);
    assert!(p.normalize);
    assert!(p.preprocess.is_empty() && p.exclude.is_empty());
    assert_eq!(p.max_categories, 100);
    assert_eq!(p.class_weight, None);
    assert_eq!(p.n_features, None);
    assert_eq!(p.index_base, 1);
    assert_eq!(p.validation, None);
    assert_eq!(p.label, "label");
    assert_eq!(p.epochs, 20);
    assert_eq!(p.learning_rate, 0.01);
    assert_eq!(p.decay, 0.95);
    assert_eq!(p.l2, 0.0);
    assert_eq!(p.batch_size, 1);
    assert_eq!(p.tolerance, 0.0);
    assert_eq!(p.seed, None);
    assert_eq!(p.shuffle, ShuffleMode::Corgipile);
    assert_eq!(p.block_size, BlockSize::Auto);
    assert_eq!(p.buffer_size, BufferSize::Fraction(0.10));
    assert!(!p.buffer_size_explicit);
    assert!(p.double_buffer);
    assert!(p.verbose);
}

#[test]
fn every_key_accepts_a_valid_value() {
    let p = parse(json!({
        "features": "x", "label": "y", "epochs": 1000000, "learning_rate": 2, "decay": 1,
        "l2": 0.5, "batch_size": 64, "tolerance": 1e-4, "seed": 9223372036854775807u64,
        "shuffle": "block_only", "block_size": "1MB", "buffer_size": 5000,
        "double_buffer": false, "verbose": false
    }))
    .unwrap();
    assert_eq!(p.features, Features::Column("x".into()));
    assert_eq!(p.label, "y");
    assert_eq!(p.epochs, 1_000_000);
    assert_eq!(p.learning_rate, 2.0);
    assert_eq!(p.decay, 1.0);
    assert_eq!(p.l2, 0.5);
    assert_eq!(p.batch_size, 64);
    assert_eq!(p.tolerance, 1e-4);
    assert_eq!(p.seed, Some(i64::MAX as u64));
    assert_eq!(p.shuffle, ShuffleMode::BlockOnly);
    assert_eq!(p.block_size, BlockSize::Bytes(1 << 20));
    assert_eq!(p.buffer_size, BufferSize::Tuples(5000));
    assert!(p.buffer_size_explicit);
    assert!(!p.double_buffer);
    assert!(!p.verbose);

    assert_eq!(
        parse(json!({"shuffle": "no_shuffle"})).unwrap().shuffle,
        ShuffleMode::NoShuffle
    );
    assert_eq!(parse(json!({"seed": null})).unwrap().seed, None);
    assert_eq!(parse(json!({"seed": 0})).unwrap().seed, Some(0));
    assert_eq!(parse(json!({"epochs": 20.0})).unwrap().epochs, 20); // jsonb may keep ".0"
    assert_eq!(
        parse(json!({"block_size": 16})).unwrap().block_size,
        BlockSize::Pages(16)
    );
    assert_eq!(
        parse(json!({"block_size": 2147483648u64}))
            .unwrap()
            .block_size,
        BlockSize::Pages(1 << 31)
    );
    assert_eq!(
        parse(json!({"block_size": "auto"})).unwrap().block_size,
        BlockSize::Auto
    );
    assert_eq!(
        parse(json!({"buffer_size": "25%"})).unwrap().buffer_size,
        BufferSize::Fraction(0.25)
    );
    assert_eq!(
        parse(json!({"buffer_size": "100 %"})).unwrap().buffer_size,
        BufferSize::Fraction(1.0)
    );
    assert_eq!(
        parse(json!({"buffer_size": "64 mb"})).unwrap().buffer_size,
        BufferSize::Bytes(64 << 20)
    );
}

/// Asserts the error names the key and the given value, and the hint gives the rule.
fn check_bad(key: &str, value: Value, hint_part: &str) {
    let e = err(json!({ key: value.clone() }));
    assert!(e.message.contains(&format!("\"{key}\"")), "{e:?}");
    assert!(e.message.contains(&value.to_string()), "{e:?}");
    let hint = e.hint.as_deref().unwrap_or_default();
    assert!(
        hint.starts_with(key) && hint.contains(hint_part),
        "{key}: {hint}"
    );
}

#[test]
fn every_key_rejects_wrong_types_and_ranges() {
    check_bad("label", json!(""), "non-empty string");
    check_bad("label", json!(1), "non-empty string");
    check_bad("label", json!(null), "non-empty string");
    check_bad("label", json!(["a"]), "non-empty string");
    for (key, max) in [("epochs", 1_000_000u64), ("batch_size", 1_000_000)] {
        for bad in [
            json!(0),
            json!(-1),
            json!(max + 1),
            json!(2.5),
            json!("10"),
            json!(true),
            json!(null),
        ] {
            check_bad(key, bad, &format!("an integer from 1 to {max}"));
        }
    }
    for bad in [
        json!(0),
        json!(-0.1),
        json!(1e6 + 1.0),
        json!(1e300),
        json!("0.1"),
        json!(null),
    ] {
        check_bad("learning_rate", bad, "> 0 and <= 1000000");
    }
    for bad in [json!(0), json!(1.01), json!(-0.5), json!(false)] {
        check_bad("decay", bad, "> 0 and <= 1");
    }
    for bad in [json!(-1e-9), json!(2e6), json!("1")] {
        check_bad("l2", bad, ">= 0 and <= 1000000");
    }
    for bad in [json!(-1), json!("x")] {
        check_bad("tolerance", bad, ">= 0");
    }
    for bad in [
        json!(-1),
        json!(9223372036854775808u64),
        json!(1.5),
        json!("42"),
    ] {
        check_bad("seed", bad, "0 to 9223372036854775807");
    }
    for bad in [json!("random"), json!("Corgipile"), json!(1), json!(null)] {
        check_bad("shuffle", bad, "\"block_only\"");
    }
    for bad in [
        json!(0),
        json!(-4),
        json!(2147483649u64),
        json!(1.5),
        json!("10"),
        json!("0MB"),
        json!("big"),
        json!(true),
    ] {
        check_bad("block_size", bad, "\"auto\"");
    }
    for bad in [
        json!("0%"),
        json!("101%"),
        json!("-5%"),
        json!("%"),
        json!("nan%"),
        json!("1e1%"),
        json!(0),
        json!(-3),
        json!(2.5),
        json!("10"),
        json!("10XB"),
        json!(false),
    ] {
        check_bad("buffer_size", bad, "percentage");
    }
    for key in ["double_buffer", "verbose"] {
        for bad in [json!(1), json!("true"), json!(null)] {
            check_bad(key, bad, "true or false");
        }
    }
}

#[test]
fn error_messages_read_well() {
    let e = err(json!({"epochs": 0}));
    assert_eq!(
        e.message,
        "invalid value for parameter \"epochs\": 0 (out of range)"
    );
    assert_eq!(
        e.hint.as_deref(),
        Some("epochs must be an integer from 1 to 1000000 (default 20)")
    );
    let e = err(json!({"epochs": "10"}));
    assert_eq!(
        e.message,
        "invalid value for parameter \"epochs\": \"10\" (expected an integer, got string)"
    );
    let e = err(json!({"epochs": 2.5}));
    assert_eq!(
        e.message,
        "invalid value for parameter \"epochs\": 2.5 (not an integer)"
    );
    // Long values are shortened.
    let e = err(json!({"label": vec!["x"; 100]}));
    assert!(e.message.len() < 150, "{}", e.message);
}

#[test]
fn unknown_key_suggests_the_closest() {
    let e = err(json!({"lerning_rate": 0.1}));
    assert_eq!(e.message, "unknown parameter \"lerning_rate\"");
    let hint = e.hint.unwrap();
    assert!(
        hint.starts_with(
            "did you mean \"learning_rate\"? valid parameters are: features, label, epochs,"
        ),
        "{hint}"
    );
    assert!(
        hint.ends_with(
            "optimizer, momentum, factors, patience, search, search_trials, select_by, folds, group_by, min_group_rows, warm_start, since, replay, name, deploy, margin"
        ),
        "{hint}"
    );

    assert!(err(json!({"Epochs": 3}))
        .hint
        .unwrap()
        .starts_with("did you mean \"epochs\"?"));
    assert!(err(json!({"batchsize": 3}))
        .hint
        .unwrap()
        .starts_with("did you mean \"batch_size\"?"));

    let e = err(json!({"dropout": 0.9}));
    assert_eq!(e.message, "unknown parameter \"dropout\"");
    assert_eq!(
        e.hint.unwrap(),
        format!("valid parameters are: {}", TrainParams::KEYS.join(", "))
    );

    // Unknown keys are reported even when another value is also bad.
    assert!(err(json!({"epochs": 0, "zzz": 1})).message.contains("zzz"));
}

#[test]
fn not_an_object() {
    for (v, t) in [
        (json!([1]), "array"),
        (json!(null), "null"),
        (json!("x"), "string"),
        (json!(3), "number"),
        (json!(true), "boolean"),
    ] {
        assert_eq!(
            err(v).message,
            format!("params must be a JSON object, got {t}")
        );
    }
}

#[test]
fn to_json_round_trips() {
    let d = TrainParams::defaults();
    let j = d.to_json();
    assert_eq!(
        j,
        json!({
            "features": "features", "label": "label", "epochs": 20, "learning_rate": 0.01,
            "learning_rate_schedule": "exponential", "decay": 0.95, "l2": 0.0, "l1": 0.0,
            "batch_size": 1, "fit_intercept": true, "normalize": true, "statistics": "sample", "exclude": [], "preprocess": {},
            "max_categories": 100, "only": false, "average": true, "inference": false, "class_weight": null,
            "n_features": null, "index_base": 1, "validation": null, "patience": null, "tolerance": 0.0, "seed": null, "shuffle": "corgipile",
            "block_size": "auto", "buffer_size": "10%", "double_buffer": true, "workers": 0, "sync": "auto", "verbose": true,
            "name": null
        })
    );
    // Every key but the network's four, the factorization machine's one, the search's three,
    // folds, the groups' two, "where", "warm_start", "since", "replay", "deploy" and "margin".
    assert_eq!(j.as_object().unwrap().len(), TrainParams::KEYS.len() - 17);
    assert_eq!(TrainParams::from_json(&j).unwrap(), d);

    let inputs = [
        json!({"seed": 123, "shuffle": "no_shuffle", "block_size": 7, "buffer_size": "7%"}),
        json!({"block_size": "2.5MB", "buffer_size": "64MB", "epochs": 3}),
        json!({"block_size": "8192B", "buffer_size": 1000, "l2": 1e-5, "learning_rate": 0.3}),
        json!({"block_size": "1 TB", "buffer_size": "12.345%", "decay": 1}),
        json!({"buffer_size": "0.001%", "tolerance": 0.5, "verbose": false, "double_buffer": false}),
        json!({"buffer_size": "33.333333333333336%", "features": "f", "label": "l"}),
        json!({"buffer_size": "10%"}),
    ];
    for input in inputs {
        let p = parse(input.clone()).unwrap();
        let out = p.to_json();
        assert_eq!(TrainParams::from_json(&out).unwrap(), p, "{input} → {out}");
    }
    let p = parse(json!({"block_size": "2.5MB", "buffer_size": "7%"})).unwrap();
    assert_eq!(p.to_json()["block_size"], json!("2560kB"));
    assert_eq!(p.to_json()["buffer_size"], json!("7%"));
    let p = parse(json!({"block_size": 1280, "buffer_size": "1GB", "seed": 5})).unwrap();
    assert_eq!(p.to_json()["block_size"], json!(1280));
    assert_eq!(p.to_json()["buffer_size"], json!("1GB"));
    assert_eq!(p.to_json()["seed"], json!(5));
}

#[test]
fn explicit_flags_follow_the_value() {
    let p = parse(json!({"buffer_size": "10%", "block_size": "auto"})).unwrap();
    assert!(!p.buffer_size_explicit);
    let p = parse(json!({"buffer_size": "20%", "block_size": 4})).unwrap();
    assert!(p.buffer_size_explicit);
}

#[test]
fn train_config_carries_the_sgd_settings() {
    let p = parse(json!({"learning_rate": 0.5, "decay": 0.9, "l2": 0.1, "batch_size": 8})).unwrap();
    let c = p.train_config(corgipile_ml::model::ModelKind::Logistic);
    assert_eq!(
        (c.learning_rate, c.schedule, c.l2, c.batch_size),
        (0.5, LrSchedule::Exponential { decay: 0.9 }, 0.1, 8)
    );
    assert_eq!((c.l1, c.fit_intercept), (0.0, true));
    assert_eq!(c.class_weights, None);
    assert_eq!(c.standardizer, None);
    assert_eq!(c.kind, corgipile_ml::model::ModelKind::Logistic);
}

#[test]
fn new_keys_accept_valid_values() {
    let p = parse(json!({
        "features": ["a", "b", "c"], "learning_rate_schedule": "inverse_sqrt", "l1": 0.01,
        "fit_intercept": false, "normalize": true, "class_weight": "balanced",
        "n_features": 2147483647, "index_base": 0, "validation": {"fraction": 0.2}
    }))
    .unwrap();
    assert_eq!(
        p.features,
        Features::Columns(vec!["a".into(), "b".into(), "c".into()])
    );
    assert_eq!(p.learning_rate_schedule, ScheduleKind::InverseSqrt);
    assert_eq!(p.l1, 0.01);
    assert!(!p.fit_intercept && p.normalize);
    assert_eq!(p.class_weight, Some(ClassWeight::Balanced));
    assert_eq!(p.n_features, Some(i32::MAX as u32));
    assert_eq!(p.index_base, 0);
    assert_eq!(p.validation, Some(Validation::Fraction(0.2)));
    let c = p.train_config(corgipile_ml::model::ModelKind::Softmax);
    assert_eq!(c.schedule, LrSchedule::InverseSqrt);
    assert_eq!((c.l1, c.fit_intercept), (0.01, false));

    let p = parse(json!({
        "features": {"indices": "idx", "values": "val"}, "learning_rate_schedule": "constant",
        "class_weight": {"1": 5, "0": 0.5}, "validation": {"relation": "held_out"}, "n_features": 1
    }))
    .unwrap();
    assert!(p.features.is_sparse());
    assert_eq!(
        p.features,
        Features::Sparse {
            indices: "idx".into(),
            values: "val".into()
        }
    );
    assert_eq!(
        p.train_config(corgipile_ml::model::ModelKind::Linear)
            .schedule,
        LrSchedule::Constant
    );
    let Some(ClassWeight::Map(m)) = &p.class_weight else {
        panic!("{:?}", p.class_weight)
    };
    assert_eq!((m["0"], m["1"]), (0.5, 5.0));
    assert_eq!(p.validation, Some(Validation::Relation("held_out".into())));
    assert_eq!(p.n_features, Some(1));
    let p = parse(json!({"validation": {"predicate": "id % 5 = 0"}, "features": ["x"]})).unwrap();
    assert_eq!(
        p.validation,
        Some(Validation::Predicate("id % 5 = 0".into()))
    );
    assert_eq!(p.features, Features::Columns(vec!["x".into()]));
    assert!(!p.features.is_sparse());
}

#[test]
fn new_keys_reject_bad_values() {
    for bad in [
        json!(""),
        json!(1),
        json!(null),
        json!([]),
        json!(["a", "a"]),
        json!(["a", ""]),
        json!(["a", 1]),
        json!({"indices": "i"}),
        json!({"indices": "i", "values": "i"}),
        json!({"indices": "i", "values": "v", "x": "y"}),
        json!({"indices": "", "values": "v"}),
        json!({"indices": 3, "values": "v"}),
    ] {
        check_bad("features", bad, "non-empty string naming one array column");
    }
    for bad in [json!("linear"), json!("Constant"), json!(1), json!(null)] {
        check_bad("learning_rate_schedule", bad, "\"inverse_sqrt\"");
    }
    for bad in [json!(-0.1), json!(2e6), json!("0"), json!(null)] {
        check_bad("l1", bad, ">= 0 and <= 1000000");
    }
    for key in ["fit_intercept", "normalize"] {
        for bad in [json!(0), json!("false"), json!(null)] {
            check_bad(key, bad, "true or false");
        }
    }
    for bad in [
        json!("auto"),
        json!(1),
        json!(true),
        json!([1, 2]),
        json!({}),
        json!({"a": 0}),
        json!({"a": -1}),
        json!({"a": "2"}),
        json!({"a": 2e6}),
    ] {
        check_bad("class_weight", bad, "\"balanced\"");
    }
    for bad in [
        json!(0),
        json!(-5),
        json!(2147483648u64),
        json!(1.5),
        json!("10"),
    ] {
        check_bad("n_features", bad, "1 to 2147483647");
    }
    for bad in [json!(2), json!(-1), json!(0.5), json!("1"), json!(null)] {
        check_bad("index_base", bad, "0 or 1");
    }
    for bad in [
        json!("20%"),
        json!(0.2),
        json!({}),
        json!({"fraction": 0}),
        json!({"fraction": 1}),
        json!({"fraction": "0.2"}),
        json!({"relation": ""}),
        json!({"predicate": 3}),
        json!({"table": "t"}),
        json!({"relation": "t", "predicate": "x"}),
    ] {
        check_bad("validation", bad, "{\"fraction\": f}");
    }
    let e = err(json!({"features": ["a", "b", "a"]}));
    assert_eq!(
        e.message,
        "invalid value for parameter \"features\": [\"a\",\"b\",\"a\"] (column \"a\" is listed twice)"
    );
    let e = err(json!({"validation": {"fraction": 1.5}}));
    assert!(
        e.message
            .ends_with("(fraction must be a number > 0 and < 1)"),
        "{}",
        e.message
    );
    assert!(err(json!({"l_1": 1}))
        .hint
        .unwrap()
        .starts_with("did you mean \"l1\"?"));
}

#[test]
fn new_keys_round_trip() {
    let inputs = [
        json!({"features": ["a", "b"], "learning_rate_schedule": "constant", "l1": 0.5}),
        json!({"features": {"indices": "i", "values": "v"}, "n_features": 1000000, "index_base": 0}),
        json!({"class_weight": "balanced", "normalize": true, "fit_intercept": false}),
        json!({"class_weight": {"yes": 3.5, "no": 1.5}, "validation": {"fraction": 0.25}}),
        json!({"validation": {"relation": "s.t"}}),
        json!({"validation": {"predicate": "id % 5 = 0"}, "learning_rate_schedule": "inverse_sqrt"}),
    ];
    // "where" and "warm_start" are written back when given (and then listed).
    for input in [
        json!({"where": "region = 'EU' AND amount > 0"}),
        json!({"warm_start": 42}),
        json!({"warm_start": "churn model"}),
    ] {
        let p = parse(input.clone()).unwrap();
        let out = p.to_json();
        assert_eq!(out.as_object().unwrap().len(), TrainParams::KEYS.len() - 16);
        for (k, v) in input.as_object().unwrap() {
            assert_eq!(&out[k], v, "{k}");
        }
        assert_eq!(TrainParams::from_json(&out).unwrap(), p, "{input} → {out}");
    }
    assert_eq!(
        parse(json!({"warm_start": "7"})).unwrap().warm_start,
        Some(corgipile_ml::params::ModelKey::Id(7))
    );
    for bad in [
        json!({"where": ""}),
        json!({"where": "  "}),
        json!({"where": 5}),
        json!({"warm_start": 0}),
        json!({"warm_start": ""}),
        json!({"warm_start": [1]}),
    ] {
        assert!(parse(bad.clone()).is_err(), "{bad} was accepted");
    }
    let kind = corgipile_ml::model::ModelKind::Logistic;
    assert!(TrainParams::for_kind(&json!({"warm_start": "m", "folds": 3}), kind).is_err());
    // "since" continues its model, reading a replay sample of 0.1 unless told; "replay" alone
    // is refused.
    let p = TrainParams::for_kind(&json!({"since": "nightly"}), kind).unwrap();
    assert_eq!(
        p.warm_start,
        Some(corgipile_ml::params::ModelKey::Name("nightly".into()))
    );
    assert_eq!(p.replay, Some(0.1));
    assert_eq!(
        TrainParams::for_kind(&json!({"since": "a", "warm_start": 3}), kind)
            .unwrap()
            .warm_start,
        Some(corgipile_ml::params::ModelKey::Id(3))
    );
    assert!(TrainParams::for_kind(&json!({"replay": 0.2}), kind).is_err());
    assert!(TrainParams::for_kind(&json!({"since": "a", "replay": 1.5}), kind).is_err());
    assert!(
        TrainParams::for_kind(&json!({"since": "a", "group_by": "g", "name": "n"}), kind).is_err()
    );
    for input in inputs {
        let p = parse(input.clone()).unwrap();
        let out = p.to_json();
        // A linear model's params list every key but the network's four, the factorization
        // machine's one, the search's three, folds, the groups' two, and "where", "warm_start",
        // "since", "replay", "deploy" and "margin" (null).
        assert_eq!(out.as_object().unwrap().len(), TrainParams::KEYS.len() - 17);
        for (k, v) in input.as_object().unwrap() {
            assert_eq!(&out[k], v, "{k}");
        }
        assert_eq!(TrainParams::from_json(&out).unwrap(), p, "{input} → {out}");
    }
}

#[test]
fn class_weight_resolution() {
    let labels = vec!["no".to_string(), "yes".to_string()];
    assert_eq!(
        ClassWeight::Balanced.resolve(&labels, &[3, 1]).unwrap(),
        vec![4.0 / 6.0, 2.0]
    );
    let p = parse(json!({"class_weight": {"yes": 5}})).unwrap();
    let cw = p.class_weight.unwrap();
    assert_eq!(cw.resolve(&labels, &[3, 1]).unwrap(), vec![1.0, 5.0]);
    let e = cw.resolve(&["0".into(), "1".into()], &[1, 1]).unwrap_err();
    assert_eq!(
        e.message,
        "class_weight names label \"yes\", which does not occur in the label column"
    );
}

#[test]
fn model_names() {
    let p = TrainParams::from_json(&json!({"name": "churn v2"})).unwrap();
    assert_eq!(p.name.as_deref(), Some("churn v2"));
    assert_eq!(
        TrainParams::from_json(&json!({"name": null})).unwrap().name,
        None
    );
    assert_eq!(TrainParams::from_json(&p.to_json()).unwrap(), p);
    for (bad, problem) in [
        (json!(""), "empty"),
        (json!(" churn"), "leading or trailing white space"),
        (json!("x".repeat(201)), "longer than 200 characters"),
        (json!("42"), "a number: numbers stand for model ids"),
    ] {
        let e = err(json!({ "name": bad }));
        assert!(e.message.contains(problem), "{}", e.message);
        assert!(e
            .hint
            .unwrap()
            .starts_with("name must be null or a string of 1 to 200 characters, not an integer"));
    }
    assert!(err(json!({"name": 7}))
        .message
        .contains("invalid value for parameter \"name\""));
    // 200 characters, multi-byte, is fine.
    assert!(TrainParams::from_json(&json!({ "name": "é".repeat(200) })).is_ok());
}

#[test]
fn param_error_displays_its_message_only() {
    let e = ParamError {
        message: "\"epochs\" must be at least 1, got 0".into(),
        hint: Some("a hint is not part of the message".into()),
    };
    assert_eq!(e.to_string(), "\"epochs\" must be at least 1, got 0");
    assert_eq!(format!("{e:>60}"), "\"epochs\" must be at least 1, got 0");
    let e = ParamError {
        message: String::new(),
        hint: None,
    };
    assert_eq!(e.to_string(), "");
    let _: &dyn std::error::Error = &e;
}

#[test]
fn network_kinds_get_their_own_defaults_and_keys() {
    use corgipile_ml::model::ModelKind;
    use corgipile_ml::params::OptimizerName;
    let p = TrainParams::for_kind(&json!({}), ModelKind::Mlp).unwrap();
    assert_eq!(p.hidden, Some(vec![64]));
    assert_eq!(p.optimizer, Some(OptimizerName::Adam));
    assert_eq!(p.momentum, None);
    assert_eq!(
        (p.learning_rate, p.batch_size, p.average),
        (0.001, 32, false)
    );
    assert_eq!(p.learning_rate_schedule.name(), "constant");
    // Stored params list the network's keys, and read back the same.
    let out = p.to_json();
    assert_eq!(out["hidden"], json!([64]));
    assert_eq!(out["activation"], json!("relu"));
    assert_eq!(TrainParams::for_kind(&out, ModelKind::Mlp).unwrap(), p);

    let p = TrainParams::for_kind(
        &json!({"optimizer": "sgd", "hidden": [8, 4], "batch_size": 5, "learning_rate": 0.2}),
        ModelKind::MlpRegression,
    )
    .unwrap();
    assert_eq!(
        (p.momentum, p.learning_rate, p.batch_size),
        (Some(0.9), 0.2, 5)
    );
    assert_eq!(p.hidden, Some(vec![8, 4]));

    // Linear kinds: unchanged defaults, and the network's keys refused.
    let p = TrainParams::for_kind(&json!({}), ModelKind::Svm).unwrap();
    assert_eq!(p, TrainParams::defaults());
    let e = TrainParams::for_kind(&json!({"hidden": [3]}), ModelKind::Logistic).unwrap_err();
    assert_eq!(
        e.message,
        "\"hidden\" applies to mlp and mlp_regression only"
    );
    for (bad, message) in [
        (
            json!({"momentum": 0.5}),
            "\"momentum\" applies to \"optimizer\": \"sgd\" only",
        ),
        (
            json!({"average": true}),
            "\"average\" cannot be used with mlp and mlp_regression",
        ),
        (
            json!({"l1": 0.1}),
            "\"l1\" cannot be used with mlp and mlp_regression",
        ),
        (json!({"patience": 3}), "\"patience\" needs \"validation\""),
    ] {
        assert_eq!(
            TrainParams::for_kind(&bad, ModelKind::Mlp)
                .unwrap_err()
                .message,
            message,
            "{bad}"
        );
    }
    for bad in [
        json!({"hidden": []}),
        json!({"hidden": [0]}),
        json!({"hidden": [65537]}),
        json!({"hidden": "64"}),
        json!({"activation": "sigmoid"}),
        json!({"optimizer": "lbfgs"}),
        json!({"momentum": 1.0}),
    ] {
        let e = TrainParams::for_kind(&bad, ModelKind::Mlp).unwrap_err();
        assert!(
            e.message.starts_with("invalid value for parameter") || e.message.contains("must be"),
            "{bad}: {}",
            e.message
        );
    }
}

#[test]
fn a_deploy_gate_needs_a_name_held_out_rows_and_one_process() {
    use corgipile_ml::model::ModelKind;
    use corgipile_ml::params::DeployRule;
    let gate = |v: Value, kind| TrainParams::for_kind(&v, kind);
    let msg = |v: Value, kind| gate(v, kind).unwrap_err().message;
    // Given a name and validation, margin defaults to 0 and both are stored.
    let p = gate(
        json!({"deploy": "if_better", "name": "n", "validation": {"fraction": 0.1}}),
        ModelKind::Logistic,
    )
    .unwrap();
    assert_eq!(
        (p.deploy, p.margin),
        (Some(DeployRule::IfBetter), Some(0.0))
    );
    assert_eq!(p.to_json()["deploy"], json!("if_better"));
    assert_eq!(p.to_json()["margin"], json!(0.0));
    // Without it, neither is stored.
    let p = gate(json!({}), ModelKind::Logistic).unwrap();
    assert!(p.to_json().get("deploy").is_none() && p.to_json().get("margin").is_none());
    // A network holds out 10% by default: the gate scores on them.
    let p = gate(json!({"deploy": "if_better", "name": "n"}), ModelKind::Mlp).unwrap();
    assert_eq!(p.validation, Some(Validation::Fraction(0.1)));
    // A search holds out 20% by default.
    assert!(gate(
        json!({"deploy": "if_better", "name": "n", "search": {"l2": [0, 0.01]}}),
        ModelKind::Logistic
    )
    .is_ok());
    // "since" (and a warm start) name the version: "name" defaults to its model's.
    assert!(gate(
        json!({"deploy": "if_better", "since": "n", "validation": {"fraction": 0.1}}),
        ModelKind::Logistic
    )
    .is_ok());
    assert_eq!(
        msg(
            json!({"deploy": "if_better", "validation": {"fraction": 0.1}}),
            ModelKind::Logistic
        ),
        "\"deploy\": \"if_better\" needs \"name\""
    );
    assert_eq!(
        msg(
            json!({"deploy": "if_better", "name": "n"}),
            ModelKind::Logistic
        ),
        "\"deploy\": \"if_better\" needs held-out rows: \"validation\""
    );
    assert_eq!(
        msg(json!({"margin": 0.1}), ModelKind::Logistic),
        "\"margin\" needs \"deploy\": \"if_better\""
    );
    for (extra, what) in [
        (json!({"workers": 2}), "workers"),
        (json!({"group_by": "g"}), "group_by"),
        (json!({"folds": 3}), "folds"),
    ] {
        let mut v = json!({"deploy": "if_better", "name": "n", "validation": {"fraction": 0.1}});
        v.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let e = gate(v, ModelKind::Logistic).unwrap_err();
        assert_eq!(
            e.message,
            format!("\"deploy\": \"if_better\" cannot be used with \"{what}\" yet")
        );
        assert!(e.not_supported(), "{e:?}");
    }
    for bad in [json!("always"), json!(true), json!(1)] {
        assert!(parse(json!({ "deploy": bad })).is_err());
    }
    for bad in [json!(-0.1), json!(1.5), json!("0.1")] {
        assert!(parse(json!({ "deploy": "if_better", "margin": bad })).is_err());
    }
}
