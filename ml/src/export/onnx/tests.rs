use std::collections::HashSet;

use prost::Message;
use serde_json::json;

use super::proto::{DimensionValue, ModelProto, FLOAT64, INT64, STRING};
use super::*;
use crate::fm::{FmModel, Machine};
use crate::model::{Head, LinearModel, ModelKind};
use crate::network::{Activation, Network, NetworkModel};
use crate::preprocess::{EncodedColumn, Preprocessor, TimeKind, TimePart};

fn columns(extra: Vec<serde_json::Value>) -> Preprocessor {
    let mut columns = vec![
        json!({"name": "x", "source": "number", "offset": 0, "impute": "mean", "scaled": true,
               "encode": "number", "fill": 1.5, "mean": 1.5, "std": 1.0}),
        json!({"name": "c", "source": "text", "offset": 1, "impute": "category",
               "scaled": false, "encode": "one_hot", "categories": ["a", "b'c"],
               "other": true, "null": true}),
        json!({"name": "p", "source": "number", "offset": 5, "impute": "zero", "scaled": false,
               "encode": "ple", "fill": 0.0, "mean": 0.0, "std": 1.0,
               "edges": [0.0, 1.0, 4.0]}),
    ];
    let mut at = 7;
    for mut c in extra {
        c["offset"] = json!(at);
        at += match c["encode"].as_str() {
            Some("array") => c["fill"].as_array().unwrap().len(),
            Some("hash") => c["buckets"].as_u64().unwrap() as usize,
            Some("one_hot") => c["categories"].as_array().unwrap().len(),
            _ => 1,
        };
        columns.push(c);
    }
    Preprocessor::from_json(&json!({"columns": columns, "n_features": at, "rows": 10}))
        .expect("a sound preprocessing")
}

fn linear(kind: ModelKind, n: usize) -> Model {
    Model::new(LinearModel::single(
        kind,
        (0..n).map(|j| 0.25 * j as f64 - 0.5).collect(),
        0.125,
    ))
}

fn export<'a>(model: &'a Model, inputs: Inputs<'a>, classes: Classes<'a>) -> OnnxExport<'a> {
    OnnxExport {
        model,
        inputs,
        classes,
        name: "m",
        producer_version: "0.5.0",
        max_bytes: 1 << 20,
    }
}

fn decode(bytes: &[u8]) -> ModelProto {
    ModelProto::decode(bytes).expect("the bytes decode as a ModelProto")
}

/// The value's element type and dimensions (`None` for the row count `N`).
fn type_of(v: &ValueInfoProto) -> (i32, Vec<Option<i64>>) {
    let t = v.r#type.as_ref().unwrap().tensor_type.as_ref().unwrap();
    let dims = t
        .shape
        .as_ref()
        .unwrap()
        .dim
        .iter()
        .map(|d| match d.value.as_ref().unwrap() {
            DimensionValue::DimValue(n) => Some(*n),
            DimensionValue::DimParam(p) => {
                assert_eq!(p, "N");
                None
            }
        })
        .collect();
    (t.elem_type, dims)
}

/// What ONNX requires of a graph: every value made once, every node reading only inputs,
/// constants or what an earlier node made (the nodes topologically sorted), every output made;
/// and every operator one the graph's opsets have.
fn check_graph(m: &ModelProto) {
    assert_eq!(m.ir_version, IR_VERSION);
    let opsets: Vec<(&str, i64)> = m
        .opset_import
        .iter()
        .map(|o| (o.domain.as_str(), o.version))
        .collect();
    assert_eq!(opsets, [("", OPSET), ("ai.onnx.ml", ML_OPSET)]);
    let g = m.graph.as_ref().unwrap();
    let mut defined = HashSet::new();
    for v in g
        .input
        .iter()
        .map(|i| &i.name)
        .chain(g.initializer.iter().map(|t| &t.name))
    {
        assert!(defined.insert(v.clone()), "{v} defined twice");
    }
    for t in &g.initializer {
        let n: i64 = t.dims.iter().product();
        let len = match t.data_type {
            FLOAT64 => t.double_data.len(),
            INT64 => t.int64_data.len(),
            STRING => t.string_data.len(),
            other => panic!("initializer {} of type {other}", t.name),
        };
        assert_eq!(len as i64, n, "{}", t.name);
    }
    const STANDARD: [&str; 26] = [
        "IsNaN",
        "Where",
        "Or",
        "ReduceSum",
        "Equal",
        "Cast",
        "Sub",
        "Div",
        "Max",
        "Min",
        "Concat",
        "MatMul",
        "Add",
        "Mul",
        "Reshape",
        "Relu",
        "Tanh",
        "Identity",
        "GreaterOrEqual",
        "ArgMax",
        "Gather",
        "Neg",
        "Abs",
        "Softmax",
        "Exp",
        "Log",
    ];
    for node in &g.node {
        match node.domain.as_str() {
            "" => assert!(
                STANDARD.contains(&node.op_type.as_str()),
                "{}",
                node.op_type
            ),
            "ai.onnx.ml" => assert_eq!(node.op_type, "LabelEncoder"),
            other => panic!("domain {other}"),
        }
        for i in &node.input {
            assert!(
                defined.contains(i),
                "{} reads {i} before it is made",
                node.name
            );
        }
        for o in &node.output {
            assert!(defined.insert(o.clone()), "{o} made twice");
        }
        for a in &node.attribute {
            // Every attribute says its type, and a singular one holds its value.
            assert!(a.r#type > 0, "{}: {}", node.name, a.name);
            if a.r#type == proto::ATTRIBUTE_INT {
                assert!(a.i.is_some(), "{}: {}", node.name, a.name);
            }
        }
    }
    for o in &g.output {
        assert!(defined.contains(&o.name), "output {} is never made", o.name);
    }
    // Every constant is read (a runtime warns of one that is not).
    let read: HashSet<&String> = g.node.iter().flat_map(|n| &n.input).collect();
    for t in &g.initializer {
        assert!(read.contains(&t.name), "{} is never read", t.name);
    }
}

fn ops(m: &ModelProto) -> Vec<String> {
    m.graph
        .as_ref()
        .unwrap()
        .node
        .iter()
        .map(|n| n.op_type.clone())
        .collect()
}

fn initializer<'m>(m: &'m ModelProto, what: &str) -> &'m proto::TensorProto {
    let g = m.graph.as_ref().unwrap();
    let found: Vec<_> = g
        .initializer
        .iter()
        .filter(|t| t.name.ends_with(what))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{what}: {:?}",
        found.iter().map(|t| &t.name).collect::<Vec<_>>()
    );
    found[0]
}

#[test]
fn a_column_list_model_has_one_input_per_column_and_the_stored_preprocessing() {
    let m = linear(ModelKind::Logistic, 7);
    let p = columns(Vec::new());
    let classes = ["no".to_owned(), "yes".to_owned()];
    let bytes = export_onnx(&export(&m, Inputs::Columns(&p), Classes::Texts(&classes))).unwrap();
    let onnx = decode(&bytes);
    check_graph(&onnx);
    assert_eq!(onnx.producer_name, "corgipile");
    let g = onnx.graph.as_ref().unwrap();
    let inputs: Vec<_> = g
        .input
        .iter()
        .map(|i| (i.name.as_str(), type_of(i)))
        .collect();
    assert_eq!(
        inputs,
        [
            ("x", (FLOAT64, vec![None, Some(1)])),
            ("c", (STRING, vec![None, Some(1)])),
            ("p", (FLOAT64, vec![None, Some(1)])),
        ]
    );
    let outputs: Vec<_> = g
        .output
        .iter()
        .map(|o| (o.name.as_str(), type_of(o)))
        .collect();
    assert_eq!(
        outputs,
        [
            ("predict", (STRING, vec![None])),
            ("decision", (FLOAT64, vec![None])),
            ("proba", (FLOAT64, vec![None, Some(2)])),
        ]
    );
    // Imputation with the stored fill.
    assert_eq!(initializer(&onnx, ":x.fill").double_data, [1.5]);
    // One-hot: the categories to slots 0 and 1, NULL (the empty string) to (null), slot 3;
    // anything else to (other), slot 2.
    let encoder = g.node.iter().find(|n| n.op_type == "LabelEncoder").unwrap();
    assert_eq!(encoder.input, ["c"]);
    let attribute = |name: &str| encoder.attribute.iter().find(|a| a.name == name).unwrap();
    assert_eq!(
        attribute("keys_strings").strings,
        [b"a".to_vec(), b"b'c".to_vec(), Vec::new()]
    );
    assert_eq!(attribute("values_int64s").ints, [0, 1, 3]);
    assert_eq!(attribute("default_int64").i, Some(2));
    assert_eq!(initializer(&onnx, ":c.slots").int64_data, [0, 1, 2, 3]);
    // Piecewise-linear bins: the low edges and the widths; the first bin open below, the last
    // above.
    assert_eq!(initializer(&onnx, ":p.bin_low").double_data, [0.0, 1.0]);
    assert_eq!(initializer(&onnx, ":p.bin_width").double_data, [1.0, 3.0]);
    assert_eq!(
        initializer(&onnx, ":p.bin_floor").double_data,
        [f64::NEG_INFINITY, 0.0]
    );
    assert_eq!(
        initializer(&onnx, ":p.bin_ceiling").double_data,
        [1.0, f64::INFINITY]
    );
    // The weights as stored, [7, 1], then the bias.
    let w = initializer(&onnx, ":outputs.weights");
    assert_eq!(w.dims, [7, 1]);
    assert_eq!(w.double_data, m.layers().unwrap()[0].weights);
    assert_eq!(initializer(&onnx, ":outputs.biases").double_data, [0.125]);
    assert_eq!(
        initializer(&onnx, ":classes").string_data,
        [b"no".to_vec(), b"yes".to_vec(), Vec::new()]
    );
    let ops = ops(&onnx);
    for op in [
        "LabelEncoder",
        "Concat",
        "MatMul",
        "GreaterOrEqual",
        "Gather",
        "Exp",
    ] {
        assert!(ops.iter().any(|o| o == op), "{op} in {ops:?}");
    }
    // No row is without a prediction: no column skips NULLs.
    assert!(!g.node.iter().any(|n| n.output[0].contains("missing")));
    let meta: Vec<_> = onnx
        .metadata_props
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        meta,
        [
            ("corgipile.kind", "logistic"),
            ("corgipile.classes", "[\"no\",\"yes\"]")
        ]
    );
}

#[test]
fn an_array_model_has_one_input_and_outputs_by_kind() {
    let m = linear(ModelKind::Linear, 5);
    let onnx =
        decode(&export_onnx(&export(&m, Inputs::Array { column: "f" }, Classes::None)).unwrap());
    check_graph(&onnx);
    let g = onnx.graph.as_ref().unwrap();
    assert_eq!(g.input.len(), 1);
    assert_eq!(
        (g.input[0].name.as_str(), type_of(&g.input[0])),
        ("f", (FLOAT64, vec![None, Some(5)]))
    );
    let outputs: Vec<_> = g
        .output
        .iter()
        .map(|o| (o.name.as_str(), type_of(o)))
        .collect();
    assert_eq!(
        outputs,
        [
            ("predict", (FLOAT64, vec![None])),
            ("decision", (FLOAT64, vec![None]))
        ]
    );
    assert_eq!(
        ops(&onnx),
        ["MatMul", "Add", "Reshape", "Identity", "Identity"]
    );
    // svm: predict and decision; softmax, mlp, fm: predict and proba.
    let svm = linear(ModelKind::Svm, 5);
    let classes = [-1.0, 1.0];
    let onnx = decode(
        &export_onnx(&export(
            &svm,
            Inputs::Array { column: "f" },
            Classes::Numbers(&classes),
        ))
        .unwrap(),
    );
    check_graph(&onnx);
    let g = onnx.graph.as_ref().unwrap();
    let names: Vec<_> = g
        .output
        .iter()
        .map(|o| (o.name.as_str(), type_of(o).0))
        .collect();
    assert_eq!(names, [("predict", FLOAT64), ("decision", FLOAT64)]);
    assert_eq!(initializer(&onnx, ":classes").double_data[..2], classes);
}

#[test]
fn networks_and_factorization_machines_become_layers_of_matmul() {
    let net = Network::new(&[3, 4, 2, 3], Activation::Tanh, Head::SOFTMAX, 7).unwrap();
    let mlp = Model::new(NetworkModel::new(ModelKind::Mlp, net));
    let classes = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
    let onnx = decode(
        &export_onnx(&export(
            &mlp,
            Inputs::Array { column: "f" },
            Classes::Texts(&classes),
        ))
        .unwrap(),
    );
    check_graph(&onnx);
    let kinds = ops(&onnx);
    assert_eq!(kinds.iter().filter(|o| *o == "MatMul").count(), 3);
    assert_eq!(kinds.iter().filter(|o| *o == "Tanh").count(), 2);
    assert!(kinds.iter().any(|o| o == "ArgMax") && kinds.iter().any(|o| o == "Softmax"));
    let layers = mlp.layers().unwrap();
    assert_eq!(initializer(&onnx, ":layer1.weights").dims, [3, 4]);
    assert_eq!(
        initializer(&onnx, ":layer2.weights").double_data,
        layers[1].weights
    );
    assert_eq!(initializer(&onnx, ":outputs.weights").dims, [2, 3]);
    let g = onnx.graph.as_ref().unwrap();
    let outputs: Vec<_> = g
        .output
        .iter()
        .map(|o| (o.name.as_str(), type_of(o)))
        .collect();
    assert_eq!(
        outputs,
        [
            ("predict", (STRING, vec![None])),
            ("proba", (FLOAT64, vec![None, Some(3)]))
        ]
    );

    let machine = Machine::new(3, 2, 2, Head::SOFTMAX, 5).unwrap();
    let fm = Model::new(FmModel::new(ModelKind::Fm, machine));
    let two = [0.0, 1.0];
    let onnx = decode(
        &export_onnx(&export(
            &fm,
            Inputs::Array { column: "f" },
            Classes::Numbers(&two),
        ))
        .unwrap(),
    );
    check_graph(&onnx);
    let layers = fm.layers().unwrap();
    let v = initializer(&onnx, ":factors");
    assert_eq!(v.dims, [3, 4]);
    assert_eq!(v.double_data, layers[1].weights);
    let squared: Vec<f64> = layers[1].weights.iter().map(|v| v * v).collect();
    assert_eq!(initializer(&onnx, ":factors.squared").double_data, squared);
    assert_eq!(initializer(&onnx, ":shape").int64_data, [0, 2, 2]);
    assert!(ops(&onnx).iter().any(|o| o == "ReduceSum"));
}

#[test]
fn skipped_nulls_mark_the_row_and_names_never_clash() {
    let m = linear(ModelKind::Logistic, 9);
    let p = columns(vec![
        json!({"name": "predict", "source": "number", "impute": "skip", "scaled": false,
               "encode": "number", "fill": 0.0, "mean": 0.0, "std": 1.0}),
        json!({"name": "corgipile:1:x", "source": "text", "impute": "error", "scaled": false,
               "encode": "one_hot", "categories": ["u"], "other": false, "null": false}),
    ]);
    let classes = [0.0, 1.0];
    let onnx =
        decode(&export_onnx(&export(&m, Inputs::Columns(&p), Classes::Numbers(&classes))).unwrap());
    check_graph(&onnx);
    let g = onnx.graph.as_ref().unwrap();
    let inputs: Vec<_> = g.input.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(inputs, ["x", "c", "p", "predict:input", "corgipile:1:x"]);
    // The graph's own values take a prefix no input has.
    assert!(g.node.iter().all(|n| n.output[0].starts_with("corgipile::")
        || ["predict", "decision", "proba"].contains(&n.output[0].as_str())));
    // NULL of the text column is the marker, and rows with it or a NaN are missing.
    let encoder = g
        .node
        .iter()
        .find(|n| n.input == ["corgipile:1:x"])
        .unwrap();
    let values = &encoder
        .attribute
        .iter()
        .find(|a| a.name == "values_int64s")
        .unwrap()
        .ints;
    assert_eq!(values, &[0, -2]);
    let ops = ops(&onnx);
    assert_eq!(ops.iter().filter(|o| *o == "Or").count(), 1);
    assert!(g.doc_string.contains("predict:input"));
}

#[test]
fn hashed_and_date_columns_large_models_and_bad_classes_are_refused() {
    let m = linear(ModelKind::Logistic, 8);
    let classes = [0.0, 1.0];
    let hashed = columns(vec![
        json!({"name": "h", "source": "text", "impute": "zero",
        "scaled": false, "encode": "hash", "buckets": 1}),
    ]);
    assert_eq!(
        export_onnx(&export(
            &m,
            Inputs::Columns(&hashed),
            Classes::Numbers(&classes)
        )),
        Err(ExportError::HashedOnnx { column: "h".into() })
    );
    let date = EncodedColumn {
        name: "d".into(),
        source: Source::Time(TimeKind::Date),
        offset: 0,
        impute: Impute::Mean,
        scaled: true,
        encoding: Encoding::Time {
            kind: TimeKind::Date,
            parts: vec![TimePart::Value],
            zone: None,
            fill: 0.0,
            mean: 0.0,
            std: 1.0,
        },
    };
    let dated = columns(vec![serde_json::to_value(&date).unwrap()]);
    assert_eq!(
        export_onnx(&export(
            &m,
            Inputs::Columns(&dated),
            Classes::Numbers(&classes)
        )),
        Err(ExportError::TimeOnnx { column: "d".into() })
    );
    let small = OnnxExport {
        max_bytes: 1000,
        ..export(
            &m,
            Inputs::Array { column: "f" },
            Classes::Numbers(&classes),
        )
    };
    assert!(matches!(
        export_onnx(&small),
        Err(ExportError::TooLarge { limit: 1000, .. })
    ));
    // The estimate bounds the bytes.
    let wide = linear(ModelKind::Linear, 10_000);
    let e = export(&wide, Inputs::Array { column: "f" }, Classes::None);
    let bytes = export_onnx(&OnnxExport {
        max_bytes: 1 << 30,
        ..e
    })
    .unwrap();
    let e = export(&wide, Inputs::Array { column: "f" }, Classes::None);
    assert!(
        (bytes.len() as u64) < estimate(&e),
        "{} >= {}",
        bytes.len(),
        estimate(&e)
    );
    assert!(estimate(&e) < 2 * bytes.len() as u64);
    let one = [1.0];
    assert_eq!(
        export_onnx(&export(
            &m,
            Inputs::Array { column: "f" },
            Classes::Numbers(&one)
        )),
        Err(ExportError::Classes {
            classes: 1,
            outputs: 2
        })
    );
    let nan = Model::new(LinearModel::single(ModelKind::Linear, vec![f64::NAN], 0.0));
    assert_eq!(
        export_onnx(&export(&nan, Inputs::Array { column: "f" }, Classes::None)),
        Err(ExportError::NotFinite)
    );
}
