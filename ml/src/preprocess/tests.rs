use super::*;
use crate::model::{LinearModel, ModelKind};
use crate::row::Row;
use serde_json::{json, Value};

fn plan(name: &str, source: Source, options: Option<ColumnOptions>) -> ColumnPlan {
    ColumnPlan::resolve(name, source, options.as_ref(), true).unwrap()
}

fn hashed(buckets: u32) -> Option<ColumnOptions> {
    Some(ColumnOptions {
        encode: Some(Encode::Hash),
        buckets: Some(buckets),
        ..Default::default()
    })
}

/// income (number), state (text, one-hot), url (text, hashed), xy (array).
fn sample() -> Preprocessor {
    let plans = vec![
        plan("income", Source::Number, None),
        plan("state", Source::Text, None),
        plan("url", Source::Text, hashed(8)),
        plan("xy", Source::NumberArray, None),
    ];
    let mut s = StatsBuilder::new(plans, 1 << 20, 1000).unwrap();
    // (amount, state, url, xy)
    type Row<'a> = (Option<f64>, Option<&'a str>, &'a str, [f64; 2]);
    let rows: [Row; 5] = [
        (Some(10.0), Some("KS"), "a", [1.0, 2.0]),
        (Some(20.0), Some("KS"), "b", [3.0, 2.0]),
        (None, Some("NY"), "c", [5.0, 2.0]),
        (Some(30.0), None, "d", [7.0, 2.0]),
        (Some(40.0), Some("CA"), "e", [9.0, 2.0]),
    ];
    for (income, state, url, xy) in rows {
        s.begin_row();
        s.number(0, income).unwrap();
        s.text(1, state.map(str::as_bytes)).unwrap();
        s.text(2, Some(url.as_bytes())).unwrap();
        s.array(3, Some(&xy)).unwrap();
    }
    s.finish(2).unwrap()
}

#[test]
fn statistics_give_means_top_categories_and_a_layout() {
    let p = sample();
    let Encoding::Number { fill, mean, std } = p.columns[0].encoding else {
        panic!()
    };
    assert_eq!((fill, mean), (25.0, 25.0)); // NULL not counted; imputed by the mean
    assert!((std - 125f64.sqrt()).abs() < 1e-12);
    // KS (2 rows) first, then the tie CA/NY broken by value; NY pooled into (other).
    assert_eq!(
        p.columns[1].encoding,
        Encoding::OneHot {
            categories: vec!["KS".into(), "CA".into()],
            other: true,
            null: true
        }
    );
    let offsets: Vec<usize> = p.columns.iter().map(|c| c.offset).collect();
    assert_eq!(offsets, vec![0, 1, 5, 13]);
    assert_eq!(p.n_features, 15);
    let names: Vec<String> = (0..p.n_features).map(|j| p.feature_name(j)).collect();
    assert_eq!(
        &names[..5],
        &[
            "income",
            "state=KS",
            "state=CA",
            "state=(other)",
            "state=(null)"
        ]
    );
    assert_eq!(names[5], "url#0");
    assert_eq!(&names[13..], &["xy[1]", "xy[2]"]);
}

#[test]
fn rows_encode_sorted_with_nulls_unseen_and_hashed_values() {
    let p = sample();
    let mut row = EncodedRow::default();
    p.number(0, None, &mut row).unwrap();
    p.text(1, Some(b"TX"), &mut row); // unseen -> (other)
    p.text(2, Some(b"zzz"), &mut row);
    p.array(3, Some(&[4.0, 2.0]), &mut row).unwrap();
    let h = 5 + bucket(b"zzz", 8);
    assert_eq!(row.indices, vec![0, 3, h as u32, 13, 14]);
    assert_eq!(row.values, vec![25.0, 1.0, 1.0, 4.0, 2.0]);
    assert!(row.indices.windows(2).all(|w| w[0] < w[1]));
    row.clear();
    p.number(0, Some(1.0), &mut row).unwrap();
    p.text(1, None, &mut row); // (null)
    p.text(2, None, &mut row); // nothing
    p.array(3, None, &mut row).unwrap(); // the means
    assert_eq!(row.indices, vec![0, 4, 13, 14]);
    assert_eq!(row.values, vec![1.0, 1.0, 5.0, 2.0]);
    assert!(matches!(
        p.array(3, Some(&[1.0]), &mut row),
        Err(PreprocessError::ArrayLength {
            got: 1,
            expected: 2,
            ..
        })
    ));
    assert!(matches!(
        p.number(0, Some(f64::NAN), &mut row),
        Err(PreprocessError::NotFinite { .. })
    ));
}

#[test]
fn standardizer_centers_numbers_only_and_folds_back_to_table_units() {
    let p = sample();
    let s = p.standardizer();
    assert_eq!(s.mean[0], 25.0);
    assert!((s.scale[0] - 1.0 / 125f64.sqrt()).abs() < 1e-15);
    assert_eq!((s.mean[1], s.scale[1]), (0.0, 1.0)); // a category
    assert_eq!(s.scale[14], 1.0); // constant array element: std 0
                                  // A model trained on standardized rows, folded, gives the same scores on raw rows.
    let mut m = LinearModel::new(ModelKind::Logistic, p.n_features, 1);
    for (j, w) in m.weights.iter_mut().enumerate() {
        *w = (j as f64 - 7.0) / 3.0;
    }
    m.bias[0] = 0.25;
    let folded = m.fold_standardizer(&s);
    let mut row = EncodedRow::default();
    p.number(0, Some(12.0), &mut row).unwrap();
    p.text(1, Some(b"CA"), &mut row);
    p.text(2, Some(b"q"), &mut row);
    p.array(3, Some(&[2.0, 2.0]), &mut row).unwrap();
    let mut scaled = Vec::new();
    s.apply_sparse(&row.indices, &row.values, &mut scaled);
    let trained = m.decision(Row::Sparse {
        indices: &row.indices,
        values: &scaled,
    });
    let stored = folded.decision(Row::Sparse {
        indices: &row.indices,
        values: &row.values,
    });
    assert!((trained - stored).abs() < 1e-12, "{trained} vs {stored}");
}

#[test]
fn json_round_trip_and_damaged_rows_refused() {
    let p = sample();
    let back = Preprocessor::from_json(&p.to_json()).unwrap();
    assert_eq!(back, p);
    let mut row = EncodedRow::default();
    back.text(1, Some(b"CA"), &mut row);
    assert_eq!(row.indices, vec![2]);
    let mut bad = p.to_json();
    bad["n_features"] = json!(99);
    assert!(Preprocessor::from_json(&bad).is_none());
    bad = p.to_json();
    bad["columns"][1]["offset"] = json!(2);
    assert!(Preprocessor::from_json(&bad).is_none());
}

#[test]
fn options_are_checked_against_the_column_type() {
    let o = |v: Value| ColumnOptions::from_json(&v);
    assert!(o(json!({"encode": "hash", "buckets": 64})).is_ok());
    assert!(o(json!({"buckets": 64})).unwrap_err().contains("hash"));
    assert!(o(json!({"encode": "ordinal"}))
        .unwrap_err()
        .contains("one_hot or hash"));
    assert!(o(json!({"impute": "median"}))
        .unwrap_err()
        .contains("mean, zero"));
    assert!(o(json!({"colour": 1}))
        .unwrap_err()
        .contains("unknown option"));
    assert!(o(json!({"encode": "hash", "buckets": 0})).is_err());
    let numeric_hash = ColumnOptions {
        encode: Some(Encode::Hash),
        ..Default::default()
    };
    assert!(ColumnPlan::resolve("a", Source::Number, Some(&numeric_hash), true).is_err());
    let text_mean = ColumnOptions {
        impute: Some(Impute::Mean),
        ..Default::default()
    };
    assert!(ColumnPlan::resolve("a", Source::Text, Some(&text_mean), true).is_err());
    let p = ColumnPlan::resolve("a", Source::Number, None, false).unwrap();
    assert_eq!((p.impute, p.scale), (Impute::Mean, Scale::None));
    let skip = ColumnOptions {
        impute: Some(Impute::Skip),
        ..Default::default()
    };
    let p = ColumnPlan::resolve("a", Source::Text, Some(&skip), true).unwrap();
    assert_eq!(p.null_action(), NullAction::Skip);
}

#[test]
fn category_dictionaries_are_bounded() {
    let mut s = StatsBuilder::new(
        vec![plan("id", Source::Text, None)],
        10 * (CATEGORY_OVERHEAD + 4),
        1,
    )
    .unwrap();
    let mut result = Ok(());
    for i in 0..100 {
        s.begin_row();
        result = s.text(0, Some(format!("{i:04}").as_bytes()));
        if result.is_err() {
            break;
        }
    }
    assert_eq!(
        result,
        Err(PreprocessError::TooManyCategories {
            column: "id".into(),
            distinct: 10
        })
    );
}

#[test]
fn hash_buckets_are_stable_and_spread() {
    // Stored models depend on these exact values.
    assert_eq!(bucket(b"", 1024), bucket(b"", 1024));
    let mut counts = [0u32; 16];
    for i in 0..16_000 {
        counts[bucket(format!("user{i}").as_bytes(), 16)] += 1;
    }
    assert!(
        counts.iter().all(|&c| (800..1200).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn array_columns_wider_than_a_model_are_refused_before_allocation() {
    let mut s = StatsBuilder::new(vec![plan("v", Source::NumberArray, None)], 1 << 20, 3).unwrap();
    s.begin_row();
    assert_eq!(
        s.array(0, Some(&[1.0; 4])),
        Err(PreprocessError::TooWide {
            column: "v".into(),
            elements: 4
        })
    );
    assert!(s.array(0, Some(&[1.0; 3])).is_ok());
}

#[test]
fn damaged_hash_or_array_columns_are_refused() {
    let p = sample();
    let mut bad = p.to_json();
    bad["columns"][2]["buckets"] = json!(0);
    assert!(Preprocessor::from_json(&bad).is_none());
    bad = p.to_json();
    bad["columns"][3]["fill"] = json!([1.0]);
    assert!(Preprocessor::from_json(&bad).is_none());
}

#[test]
fn error_messages_are_pinned() {
    // Users read these in ERRORs: byte for byte what they were.
    let cases = [
        (
            PreprocessError::TooManyCategories {
                column: "city".into(),
                distinct: 12345,
            },
            "the categories of column \"city\" (12345 distinct values so far) do not fit in corgipile.max_buffer_memory",
        ),
        (
            PreprocessError::ArrayLength {
                column: "xy".into(),
                got: 3,
                expected: 2,
            },
            "column \"xy\" has 3 elements, expected 2 (the length of the first row read)",
        ),
        (
            PreprocessError::NotFinite {
                column: "income".into(),
            },
            "column \"income\" is NaN or Infinity",
        ),
        (
            PreprocessError::TooWide {
                column: "v".into(),
                elements: 9,
            },
            "column \"v\" has 9 elements, more features than corgipile.max_model_memory allows a model",
        ),
        (
            PreprocessError::OutOfMemory,
            "out of memory for the statistics of the feature columns",
        ),
    ];
    for (e, text) in cases {
        assert_eq!(e.to_string(), text);
    }
}

#[test]
fn a_timestamp_column_becomes_its_parts_with_names_and_the_value_scaled() {
    let mut plan = plan("at", Source::Time(TimeKind::Timestamp), None);
    plan.zone = Some("Europe/Paris".into());
    assert_eq!(ColumnPlan::fixed_width(std::slice::from_ref(&plan)), 22);
    let mut s = StatsBuilder::new(vec![plan], 1 << 20, 1000).unwrap();
    // 2026-11-27 (a Friday) at 00:00 and at 12:00, and a NULL.
    let friday = 20_784.0 * 86_400.0;
    for v in [Some(friday), Some(friday + 43_200.0), None] {
        s.begin_row();
        s.time(0, v).unwrap();
    }
    let p = s.finish(10).unwrap();
    assert_eq!(p.n_features, 22);
    assert_eq!(p.zone(0), Some("Europe/Paris"));
    let names: Vec<String> = (0..22).map(|j| p.feature_name(j)).collect();
    assert_eq!(
        &names[..4],
        ["at", "at.hour_sin", "at.hour_cos", "at.dow=Mon"]
    );
    assert_eq!(names[6], "at.dow=Thu");
    assert_eq!(names[21], "at.month=Dec");
    let mut row = EncodedRow::default();
    p.time(0, Some(friday + 43_200.0), &mut row).unwrap();
    // value (days), sin/cos of noon, Friday, November.
    assert_eq!(row.indices, vec![0, 1, 2, 7, 20]);
    assert_eq!(row.values[0], 20_784.5);
    assert!(row.values[1].abs() < 1e-12 && (row.values[2] + 1.0).abs() < 1e-12);
    // A NULL: the value part imputed by the mean, no other part.
    let mut null_row = EncodedRow::default();
    p.time(0, None, &mut null_row).unwrap();
    assert_eq!(
        (null_row.indices.clone(), null_row.values.clone()),
        (vec![0], vec![20_784.25])
    );
    // Only the value part is standardized.
    let st = p.standardizer();
    assert_eq!(st.mean[0], 20_784.25);
    assert!(st.scale[0] > 1.0 && st.mean[1..].iter().all(|&m| m == 0.0));
    assert!(st.scale[1..].iter().all(|&s| s == 1.0));
    // Round trip through the stored JSON.
    let back = Preprocessor::from_json(&p.to_json()).unwrap();
    assert_eq!(back.feature_name(8), "at.dow=Sat");
    assert_eq!(back.zone(0), Some("Europe/Paris"));
}

#[test]
fn time_parts_options_are_checked() {
    let parts = |v: Value| ColumnOptions::from_json(&json!({ "parts": v }));
    assert_eq!(
        parts(json!(["dow", "value"])).unwrap().parts,
        Some(vec![TimePart::Dow, TimePart::Value])
    );
    for bad in [
        json!([]),
        json!(["day"]),
        json!(["dow", "dow"]),
        json!("dow"),
    ] {
        assert!(parts(bad.clone()).is_err(), "{bad}");
    }
    let hour = ColumnOptions::from_json(&json!({"parts": ["hour"]})).unwrap();
    let resolve = |source| ColumnPlan::resolve("c", source, Some(&hour), true);
    assert!(resolve(Source::Time(TimeKind::Date)).is_err());
    assert!(resolve(Source::Number).is_err());
    assert_eq!(
        resolve(Source::Time(TimeKind::Time)).unwrap().parts,
        vec![TimePart::Hour]
    );
    let encode = ColumnOptions::from_json(&json!({"encode": "hash"})).unwrap();
    assert!(ColumnPlan::resolve("c", Source::Time(TimeKind::Date), Some(&encode), true).is_err());
}

/// The groups "inference" drops a reference level from: a one-hot column (named levels, then
/// "(other)" and "(null)"), a date/time column's day of the week and month; not a hashed column.
#[test]
fn one_hot_groups_are_the_categorical_columns_and_date_parts() {
    let p = sample();
    // income 0, state 1..5 (KS, CA, (other), (null)), url 5..13 (hashed), xy 13..15.
    assert_eq!(
        p.one_hot_groups(),
        vec![OneHotGroup {
            column: "state".into(),
            features: 1..5,
            named: 2
        }]
    );
    assert_eq!(p.column_of(7).name, "url");
    assert_eq!(p.column_of(14).name, "xy");
    let plans = vec![
        plan("n", Source::Number, None),
        plan("at", Source::Time(TimeKind::Timestamp), None),
    ];
    let mut s = StatsBuilder::new(plans, 1 << 20, 1000).unwrap();
    s.begin_row();
    s.number(0, Some(1.0)).unwrap();
    s.time(1, Some(0.0)).unwrap();
    let p = s.finish(10).unwrap();
    // n 0; at: value 1, hour 2..4, dow 4..11, month 11..23.
    let groups = p.one_hot_groups();
    assert_eq!(
        groups,
        vec![
            OneHotGroup {
                column: "at.dow".into(),
                features: 4..11,
                named: 7
            },
            OneHotGroup {
                column: "at.month".into(),
                features: 11..23,
                named: 12
            },
        ]
    );
    assert_eq!(p.feature_name(groups[1].features.start), "at.month=Jan");
}
