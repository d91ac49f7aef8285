use super::quote::{dollar_tag, float, ident, literal};
use super::*;
use crate::model::{LinearModel, ModelKind};
use serde_json::json;

/// Reads an `E'...'` literal back as PostgreSQL does (the escapes `literal` writes), and
/// checks it ends where it should: the quote that closes it is its last character.
fn read_literal(sql: &str) -> String {
    let body = sql.strip_prefix("E'").expect("an E'' literal");
    let mut out = String::new();
    let mut chars = body.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if chars.peek() == Some(&'\'') => {
                chars.next();
                out.push('\'');
            }
            '\'' => {
                assert!(chars.next().is_none(), "the literal ended early: {sql}");
                return out;
            }
            '\\' => match chars.next().expect("an escape") {
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                '\\' => out.push('\\'),
                'x' => {
                    let hex: String = chars.by_ref().take(2).collect();
                    out.push(u8::from_str_radix(&hex, 16).unwrap() as char);
                }
                other => panic!("unexpected escape \\{other}"),
            },
            c => out.push(c),
        }
    }
    panic!("the literal is not closed: {sql}")
}

const HOSTILE: [&str; 9] = [
    "plain",
    "it's",
    "a\"b",
    "back\\slash\\",
    "new\nline\r\ttab",
    "$$; DROP TABLE t; --",
    "$corgipile$",
    "select",
    "ünï ☃ \u{1}\u{7f}",
];

#[test]
fn identifiers_are_one_quoted_name_whatever_they_hold() {
    assert_eq!(ident("x"), "\"x\"");
    assert_eq!(ident("select"), "\"select\"");
    assert_eq!(ident("a\"b"), "\"a\"\"b\"");
    assert_eq!(ident("back\\slash"), "\"back\\slash\"");
    assert_eq!(ident("ünï"), "\"ünï\"");
    for name in HOSTILE {
        let q = ident(name);
        // Inside the outer quotes, every quote is doubled: the identifier cannot end early.
        let inner = &q[1..q.len() - 1];
        assert_eq!(inner.replace("\"\"", ""), name.replace('"', ""), "{name}");
        assert_eq!(inner.replace("\"\"", "\""), name);
    }
}

#[test]
fn literals_read_back_to_the_text() {
    for text in HOSTILE {
        let l = literal(text);
        assert_eq!(read_literal(&l), text, "{l}");
        assert!(!l.contains('\n') && !l.contains('\r'), "{l}");
    }
    assert_eq!(literal("it's"), "E'it''s'");
    assert_eq!(literal("a\\b"), "E'a\\\\b'");
}

#[test]
fn numbers_round_trip_and_non_finite_ones_are_refused() {
    for v in [
        0.1,
        -0.0,
        1e-300,
        5e-324,
        1.7976931348623157e308,
        -123456.789,
        1.0 / 3.0,
    ] {
        let s = float(v).unwrap();
        let digits = s
            .strip_prefix('\'')
            .unwrap()
            .strip_suffix("'::float8")
            .unwrap();
        assert_eq!(digits.parse::<f64>().unwrap().to_bits(), v.to_bits(), "{s}");
    }
    assert_eq!(float(f64::NAN), None);
    assert_eq!(float(f64::INFINITY), None);
}

#[test]
fn the_dollar_quote_is_never_in_the_body() {
    assert_eq!(dollar_tag("x := 1;"), "$corgipile$");
    for body in [
        "E'$corgipile$'",
        "E'$corgipile_0$ $corgipile$'",
        "E'$corgipile_00000$' \"$corgipile_\"",
    ] {
        let tag = dollar_tag(body);
        assert!(!body.contains(&tag), "{tag} in {body}");
        assert!(tag.starts_with('$') && tag.ends_with('$'));
    }
}

fn logistic() -> Model {
    Model::new(LinearModel::single(
        ModelKind::Logistic,
        vec![0.5, -0.25, 0.0, 2.0],
        0.125,
    ))
}

fn columns(extra: serde_json::Value) -> Preprocessor {
    let mut columns = vec![
        json!({"name": "x", "source": "number", "offset": 0, "impute": "mean", "scaled": true,
               "encode": "number", "fill": 1.5, "mean": 1.5, "std": 1.0}),
        json!({"name": "it's \"c\" $$", "source": "text", "offset": 1, "impute": "category",
               "scaled": false, "encode": "one_hot", "categories": ["a'b", "$$x\\"],
               "other": false, "null": false}),
    ];
    columns.push(extra);
    Preprocessor::from_json(&json!({"columns": columns, "n_features": 4, "rows": 10}))
        .expect("a sound preprocessing")
}

fn export<'a>(model: &'a Model, inputs: Inputs<'a>, classes: Classes<'a>) -> Export<'a> {
    Export {
        function: "f\"n",
        model,
        inputs,
        classes,
        output: Output::Predict,
        max_bytes: 1 << 20,
    }
}

#[test]
fn a_column_list_model_becomes_one_function_of_its_columns() {
    let m = logistic();
    let p = columns(
        json!({"name": "y", "source": "number", "offset": 3, "impute": "skip",
        "scaled": false, "encode": "number", "fill": 0.0, "mean": 0.0, "std": 1.0}),
    );
    let classes = ["no".to_owned(), "yes".to_owned()];
    let sql = export_sql(&export(&m, Inputs::Columns(&p), Classes::Texts(&classes))).unwrap();
    assert!(sql.starts_with(
        "CREATE FUNCTION \"f\"\"n\"(\"x\" float8, \"it's \"\"c\"\" $$\" text, \"y\" float8) RETURNS text\n"
    ), "{sql}");
    assert!(
        sql.contains("AS $corgipile$\n") && sql.ends_with("$corgipile$;\n"),
        "{sql}"
    );
    assert!(
        sql.contains("array_position(ARRAY[E'a''b', E'$$x\\\\']::text[]"),
        "{sql}"
    );
    assert!(
        sql.contains("IF $3 IS NULL THEN RETURN NULL; END IF;"),
        "{sql}"
    );
    // The terms in feature order (a zero weight left out), then the bias.
    assert!(
        sql.contains(
            "_t := 0 + '0.5'::float8 * _x[1] + '-0.25'::float8 * _x[2] + '2.0'::float8 * _x[4];"
        ),
        "{sql}"
    );
    assert!(sql.contains("_z[1] := _t + '0.125'::float8;"), "{sql}");
    assert!(sql.contains("IF _z[1] >= 0 THEN RETURN E'yes'; ELSE RETURN E'no'; END IF;"));
}

#[test]
fn a_dense_row_adds_in_four_lanes_and_names_that_clash_are_left_out() {
    let m = Model::new(LinearModel::single(
        ModelKind::Linear,
        vec![1.0, 2.0, 3.0, 4.0, 5.0],
        0.5,
    ));
    let sql = export_sql(&export(&m, Inputs::Array { column: "_x" }, Classes::None)).unwrap();
    assert!(sql.contains("(float8[]) RETURNS float8"), "{sql}");
    assert!(sql.contains("STRICT"), "{sql}");
    assert!(sql.contains("_l0 := 0 + '1.0'::float8 * _x[1];"), "{sql}");
    assert!(sql.contains("_t := 0 + '5.0'::float8 * _x[5];"), "{sql}");
    assert!(sql.contains("_z[1] := ((_l0 + _l1) + (_l2 + _l3)) + _t + '0.5'::float8;"));
    let named = export_sql(&export(
        &m,
        Inputs::Array { column: "features" },
        Classes::None,
    ))
    .unwrap();
    assert!(
        named.contains("(\"features\" float8[]) RETURNS float8"),
        "{named}"
    );
}

#[test]
fn hashed_columns_large_models_and_bad_outputs_are_refused() {
    let m = logistic();
    let p = columns(
        json!({"name": "h", "source": "text", "offset": 3, "impute": "zero",
        "scaled": false, "encode": "hash", "buckets": 1}),
    );
    let classes = [0.0, 1.0];
    let e = export(&m, Inputs::Columns(&p), Classes::Numbers(&classes));
    assert_eq!(
        export_sql(&e),
        Err(ExportError::Hashed { column: "h".into() })
    );
    let small = Export {
        max_bytes: 100,
        ..export(
            &m,
            Inputs::Array { column: "f" },
            Classes::Numbers(&classes),
        )
    };
    assert!(matches!(
        export_sql(&small),
        Err(ExportError::TooLarge { limit: 100, .. })
    ));
    let svm = Model::new(LinearModel::single(ModelKind::Svm, vec![1.0], 0.0));
    let proba = Export {
        output: Output::Proba,
        ..export(
            &svm,
            Inputs::Array { column: "f" },
            Classes::Numbers(&classes),
        )
    };
    assert!(matches!(
        export_sql(&proba),
        Err(ExportError::NoSuchOutput { .. })
    ));
    let one = [1.0];
    assert!(matches!(
        export_sql(&export(
            &m,
            Inputs::Array { column: "f" },
            Classes::Numbers(&one)
        )),
        Err(ExportError::Classes {
            classes: 1,
            outputs: 2
        })
    ));
    let nan = Model::new(LinearModel::single(ModelKind::Linear, vec![f64::NAN], 0.0));
    assert_eq!(
        export_sql(&export(&nan, Inputs::Array { column: "f" }, Classes::None)),
        Err(ExportError::NotFinite)
    );
    assert_eq!(
        export_sql(&Export {
            function: "",
            ..export(
                &m,
                Inputs::Array { column: "f" },
                Classes::Numbers(&classes)
            )
        }),
        Err(ExportError::EmptyName)
    );
}

#[test]
fn a_body_holding_the_tag_gets_another() {
    let m = logistic();
    let p = Preprocessor::from_json(&json!({"columns": [
        {"name": "t", "source": "text", "offset": 0, "impute": "category", "scaled": false,
         "encode": "one_hot", "categories": ["$corgipile$", "b"], "other": true, "null": true}],
        "n_features": 4, "rows": 1}))
    .unwrap();
    let classes = [0.0, 1.0];
    let sql = export_sql(&export(&m, Inputs::Columns(&p), Classes::Numbers(&classes))).unwrap();
    assert!(
        sql.contains("AS $corgipile_0$\n") && sql.ends_with("$corgipile_0$;\n"),
        "{sql}"
    );
    assert_eq!(sql.matches("$corgipile_0$").count(), 2);
    // other is slot 3, null slot 4.
    assert!(sql.contains("THEN 4 ELSE COALESCE(array_position(ARRAY[E'$corgipile$', E'b']::text[], $1 COLLATE \"C\"), 3) END;"), "{sql}");
}
