//! The param table of docs/reference.md (its Training params section) is generated from the
//! param table in the code: they cannot drift apart.

use corgipile_ml::params::{param_table_markdown, TrainParams, PARAMS};

#[test]
fn reference_param_table_matches_the_code() {
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference.md"))
            .expect("docs/reference.md in the workspace");
    let header = "| param | default | accepted values | meaning |";
    let start = reference
        .find(header)
        .expect("docs/reference.md has a param table");
    let table: String = reference[start..]
        .lines()
        .take_while(|l| l.starts_with('|'))
        .map(|l| format!("{l}\n"))
        .collect();
    let generated = param_table_markdown();
    for (r, g) in table.lines().zip(generated.lines()) {
        assert_eq!(r, g, "docs/reference.md row differs from the generated one");
    }
    assert_eq!(table, generated);
}

#[test]
fn param_table_lists_every_key_once() {
    let names: Vec<&str> = PARAMS.iter().map(|p| p.name).collect();
    assert_eq!(names, TrainParams::KEYS);
    let defaults = TrainParams::defaults().to_json();
    let network_defaults =
        TrainParams::for_kind(&serde_json::json!({}), corgipile_ml::model::ModelKind::Mlp)
            .unwrap()
            .to_json();
    let fm_defaults =
        TrainParams::for_kind(&serde_json::json!({}), corgipile_ml::model::ModelKind::Fm)
            .unwrap()
            .to_json();
    let sgd_defaults = TrainParams::for_kind(
        &serde_json::json!({"optimizer": "sgd"}),
        corgipile_ml::model::ModelKind::Mlp,
    )
    .unwrap()
    .to_json();
    let group_defaults = TrainParams::for_kind(
        &serde_json::json!({"group_by": "g", "name": "n"}),
        corgipile_ml::model::ModelKind::Logistic,
    )
    .unwrap()
    .to_json();
    let since_defaults = TrainParams::for_kind(
        &serde_json::json!({"since": "m"}),
        corgipile_ml::model::ModelKind::Logistic,
    )
    .unwrap()
    .to_json();
    let gate_defaults = TrainParams::for_kind(
        &serde_json::json!({"deploy": "if_better", "name": "n", "validation": {"fraction": 0.1}}),
        corgipile_ml::model::ModelKind::Logistic,
    )
    .unwrap()
    .to_json();
    for p in PARAMS {
        if let Some(shown) = p.shown_default.strip_suffix(" (with `deploy`)") {
            let shown = shown.trim_matches('`');
            let parsed: serde_json::Value = serde_json::from_str(shown).unwrap();
            assert_eq!(
                parsed.as_f64(),
                gate_defaults[p.name].as_f64(),
                "{}",
                p.name
            );
            assert!(p.rule.contains(&format!("(default {shown})")), "{}", p.name);
            continue;
        }
        if let Some(shown) = p.shown_default.strip_suffix(" (with `since`)") {
            let shown = shown.trim_matches('`');
            let parsed: serde_json::Value = serde_json::from_str(shown).unwrap();
            assert_eq!(&parsed, &since_defaults[p.name], "{}", p.name);
            assert!(p.rule.contains(&format!("(default {shown})")), "{}", p.name);
            continue;
        }
        // The rule's "(default ...)" and the default docs/reference.md shows agree with defaults() (a
        // network's own keys, shown "`x` (mlp kinds)", with an mlp's defaults; the groups',
        // "`x` (with `group_by`)", with group_by's).
        if let Some(shown) = p.shown_default.strip_suffix(" (with `group_by`)") {
            let shown = shown.trim_matches('`');
            let parsed: serde_json::Value = serde_json::from_str(shown).unwrap();
            assert_eq!(&parsed, &group_defaults[p.name], "{}", p.name);
            assert!(p.rule.contains(&format!("(default {shown})")), "{}", p.name);
            continue;
        }
        // Keys of networks and factorization machines both: their defaults are the same.
        let shared = p.shown_default.strip_suffix(" (mlp and fm kinds)");
        if let Some(shown) = shared {
            assert_eq!(network_defaults[p.name], fm_defaults[p.name], "{}", p.name);
            assert!(p
                .rule
                .contains(&format!("(default {})", shown.trim_matches('`'))));
        }
        let (shown, value) = match (
            p.shown_default.strip_suffix(" (mlp kinds)").or(shared),
            p.shown_default.strip_suffix(" (fm kinds)"),
        ) {
            (Some(shown), _) if p.name == "momentum" => {
                (shown.trim_matches('`'), &sgd_defaults[p.name])
            }
            (Some(shown), _) => (shown.trim_matches('`'), &network_defaults[p.name]),
            (None, Some(shown)) => (shown.trim_matches('`'), &fm_defaults[p.name]),
            (None, None) => (p.shown_default.trim_matches('`'), &defaults[p.name]),
        };
        if p.name == "seed" {
            assert_eq!((shown, value), ("random", &serde_json::Value::Null));
            assert!(p.rule.ends_with("(default null)"));
            continue;
        }
        let parsed: serde_json::Value = serde_json::from_str(shown).unwrap();
        match (parsed.as_f64(), value.as_f64()) {
            (Some(a), Some(b)) => assert_eq!(a, b, "{}", p.name),
            _ => assert_eq!(&parsed, value, "{}", p.name),
        }
        assert!(
            p.rule.contains(&format!("(default {shown})")),
            "{}: {}",
            p.name,
            p.rule
        );
    }
}
