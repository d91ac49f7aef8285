//! A graph under construction: nodes in order (each added after the values it reads, so the
//! list is topologically sorted as ONNX requires), constant tensors (initializers), and names
//! for the values in between that no input or output can take.

use super::proto::{
    AttributeProto, NodeProto, TensorProto, ATTRIBUTE_INT, ATTRIBUTE_INTS, ATTRIBUTE_STRINGS,
    FLOAT64, INT64, STRING,
};

/// The ONNX-ML domain (`ai.onnx.ml`), of `LabelEncoder`.
pub const ML_DOMAIN: &str = "ai.onnx.ml";

/// Why a graph could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory;

pub struct Graph {
    pub nodes: Vec<NodeProto>,
    pub initializers: Vec<TensorProto>,
    /// Every value the graph makes is named with this prefix, which no input name starts with.
    prefix: String,
    count: usize,
}

/// A copy of `values` in a vector reserved fallibly (the largest are a model's weights).
pub fn copy<T: Clone>(values: &[T]) -> Result<Vec<T>, OutOfMemory> {
    let mut v = Vec::new();
    v.try_reserve_exact(values.len()).map_err(|_| OutOfMemory)?;
    v.extend_from_slice(values);
    Ok(v)
}

/// An attribute of one integer.
pub fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        r#type: ATTRIBUTE_INT,
        i: Some(i),
        ..Default::default()
    }
}

/// An attribute of integers.
pub fn ints(name: &str, ints: Vec<i64>) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        r#type: ATTRIBUTE_INTS,
        ints,
        ..Default::default()
    }
}

/// An attribute of strings.
pub fn strings(name: &str, strings: Vec<Vec<u8>>) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        r#type: ATTRIBUTE_STRINGS,
        strings,
        ..Default::default()
    }
}

impl Graph {
    /// A graph whose inputs are named `inputs`: its own values get a prefix none of them
    /// starts with (`corgipile:`, with more `:` until none does).
    pub fn new<'a>(inputs: impl Iterator<Item = &'a str> + Clone) -> Graph {
        let mut prefix = "corgipile:".to_owned();
        while inputs.clone().any(|name| name.starts_with(&prefix)) {
            prefix.push(':');
        }
        Graph {
            nodes: Vec::new(),
            initializers: Vec::new(),
            prefix,
            count: 0,
        }
    }

    /// A new value's name: the prefix, a number and what it holds (`corgipile:12:x.impute`).
    pub fn name(&mut self, what: &str) -> String {
        self.count += 1;
        format!("{}{}:{what}", self.prefix, self.count)
    }

    /// Adds node `op` (of `domain`, "" for the standard one) reading `inputs`, writing
    /// `output`; returns `output`.
    pub fn node_to(
        &mut self,
        domain: &str,
        op: &str,
        inputs: &[&str],
        attributes: Vec<AttributeProto>,
        output: String,
    ) -> String {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| (*s).to_owned()).collect(),
            output: vec![output.clone()],
            name: output.clone(),
            op_type: op.to_owned(),
            domain: domain.to_owned(),
            attribute: attributes,
            doc_string: String::new(),
        });
        output
    }

    /// Adds standard node `op` reading `inputs`; returns its output's new name (`what`).
    pub fn op(&mut self, op: &str, inputs: &[&str], what: &str) -> String {
        self.op_with(op, inputs, Vec::new(), what)
    }

    /// [`Graph::op`] with attributes.
    pub fn op_with(
        &mut self,
        op: &str,
        inputs: &[&str],
        attributes: Vec<AttributeProto>,
        what: &str,
    ) -> String {
        let output = self.name(what);
        self.node_to("", op, inputs, attributes, output)
    }

    fn tensor(&mut self, what: &str, dims: &[usize], data_type: i32) -> TensorProto {
        TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type,
            name: self.name(what),
            ..Default::default()
        }
    }

    fn constant(&mut self, t: TensorProto) -> String {
        let name = t.name.clone();
        self.initializers.push(t);
        name
    }

    /// A constant tensor of doubles, `dims` its shape (row-major).
    pub fn doubles(&mut self, what: &str, dims: &[usize], values: Vec<f64>) -> String {
        debug_assert_eq!(dims.iter().product::<usize>(), values.len());
        let mut t = self.tensor(what, dims, FLOAT64);
        t.double_data = values;
        self.constant(t)
    }

    /// A constant tensor of 64-bit integers.
    pub fn int64s(&mut self, what: &str, dims: &[usize], values: Vec<i64>) -> String {
        debug_assert_eq!(dims.iter().product::<usize>(), values.len());
        let mut t = self.tensor(what, dims, INT64);
        t.int64_data = values;
        self.constant(t)
    }

    /// A constant tensor of strings.
    pub fn texts(&mut self, what: &str, dims: &[usize], values: Vec<Vec<u8>>) -> String {
        debug_assert_eq!(dims.iter().product::<usize>(), values.len());
        let mut t = self.tensor(what, dims, STRING);
        t.string_data = values;
        self.constant(t)
    }

    /// A scalar double.
    pub fn scalar(&mut self, what: &str, v: f64) -> String {
        self.doubles(what, &[], vec![v])
    }

    /// `Cast` of `x` to `to` (a `TensorProto.DataType`).
    pub fn cast(&mut self, x: &str, to: i32, what: &str) -> String {
        self.op_with("Cast", &[x], vec![int("to", to as i64)], what)
    }

    /// `Where(condition, a, b)`.
    pub fn select(&mut self, condition: &str, a: &str, b: &str, what: &str) -> String {
        self.op("Where", &[condition, a, b], what)
    }

    /// Booleans as doubles (1 and 0).
    pub fn flags(&mut self, b: &str, what: &str) -> String {
        self.cast(b, FLOAT64, what)
    }

    /// `Or` of two boolean tensors, either absent.
    pub fn or(&mut self, a: Option<String>, b: String) -> String {
        match a {
            Some(a) => self.op("Or", &[&a, &b], "missing"),
            None => b,
        }
    }
}
