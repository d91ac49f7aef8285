//! Request preparation: from a SQL call's relation, model kind and params to a checked
//! pipeline config and the one query that reads the rows (`query`).

pub mod args;
pub mod citus;
mod predicate;
pub mod query;
pub mod sharded_view;
pub mod since;
pub mod validation_relation;
pub mod view;
pub mod warm_start;
use crate::exec::run::{self};
use crate::exec::sgd::SgdTask;
use crate::pg::error::raise;
use crate::pg::guc::{max_buffer_bytes, max_model_bytes};
use crate::pg::names::relation_name;
use crate::pipeline::ClassValue;
use crate::pipeline::{Distributed, Mode, PipelineConfig, ValidationSplit};
use crate::request::args::ParamsArg;
use crate::request::query::{check_relation, FeatureColumns, Input, Tabular};
use corgipile_ml::model::{ModelKind, UnknownKind};
use corgipile_ml::params::{Features as FeatureSpec, TrainParams, Validation};
use corgipile_ml::preprocess::Preprocessor;
pub use corgipile_ml::shuffle::random_seed;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// A checked request: the config every node gets and the query BlockShuffle runs.
pub(crate) struct Prepared {
    /// The relation named (a table, or a view).
    pub(crate) relid: pg_sys::Oid,
    /// The table whose pages are read: `relid`, or a simple view's base table.
    pub(crate) table: pg_sys::Oid,
    pub(crate) config: PipelineConfig,
    pub(crate) input: Input,
}

impl Prepared {
    /// Plans and runs the pipeline with `task`; its output.
    pub(crate) fn run<T: SgdTask>(&self, task: T) -> T::Output {
        run::run(self.table, &self.input.sql, &self.config, task)
    }
}

pub(crate) fn parse_model(model: &str) -> ModelKind {
    model.parse().unwrap_or_else(|e: UnknownKind| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            e.to_string(),
            Some(e.hint()),
        )
    })
}

/// The params of a model of `kind`, checked, with the kind's defaults filled in.
pub(crate) fn parse_params(params: &ParamsArg, kind: ModelKind) -> TrainParams {
    let mut params = TrainParams::for_kind(&params.0, kind)
        .unwrap_or_else(|e| crate::pg::error::raise_param_error(e));
    if params.seed.is_none() {
        params.seed = Some(random_seed());
    }
    params
}

/// Whether `params` (parsed from `given`) hold out rows and stop on them by default: the
/// default `"patience": "auto"` of networks and machines, not asked for.
pub(crate) fn stops_early_by_default(given: &ParamsArg, params: &TrainParams) -> bool {
    params.patience == Some(corgipile_ml::params::Patience::Auto)
        && given.0.get("patience").is_none()
}

pub(crate) fn feature_columns(spec: &FeatureSpec) -> FeatureColumns {
    match spec {
        FeatureSpec::Column(c) => FeatureColumns::Array(c.clone()),
        FeatureSpec::Columns(cs) => FeatureColumns::Columns(cs.clone()),
        FeatureSpec::All => FeatureColumns::All {
            exclude: Vec::new(),
        },
        FeatureSpec::Sparse { indices, values } => FeatureColumns::Sparse {
            indices: indices.clone(),
            values: values.clone(),
        },
    }
}

/// Resolve a relation for `mode` and build the pipeline config.
pub(crate) fn prepare(
    relid: pg_sys::Oid,
    kind: ModelKind,
    params: TrainParams,
    mode: Mode,
    known_classes: Vec<ClassValue>,
    stored_preprocess: Option<&Preprocessor>,
) -> Prepared {
    // A spill's temporary table is called by the view or query it holds.
    let relname = crate::pg::names::shown_name(relation_name(relid));
    let table = check_relation(relid, &relname, params.only);
    if matches!(mode, Mode::Trace) {
        query::check_trace_label(relid, &relname, &params.label);
    }
    let mut features = feature_columns(&params.features);
    let group_by = params
        .group_by
        .as_deref()
        .filter(|_| matches!(mode, Mode::Train | Mode::Evaluate));
    if group_by.is_some() && !params.features.is_tabular() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            "\"group_by\" needs feature columns (\"features\": [column, ...] or \"*\")",
            Some("A row's group is read from its columns when it is predicted: name the feature columns, or use \"*\".".into()),
        );
    }
    if let FeatureColumns::All { exclude } = &mut features {
        exclude.clone_from(&params.exclude);
        // Within one group a group column is one value: not a feature.
        for g in group_by.into_iter().flatten() {
            if !exclude.contains(g) {
                exclude.push(g.clone());
            }
        }
    } else if !params.exclude.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "\"exclude\" applies to \"features\": \"*\" only",
            Some(
                "List the feature columns you want, or use \"features\": \"*\" with \"exclude\"."
                    .into(),
            ),
        );
    }
    if !params.features.is_tabular() && !params.preprocess.is_empty() {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "\"preprocess\" applies to a list of feature columns (or \"*\")",
            Some("An array column or a sparse pair is read as it is; name its columns in \"features\" to preprocess them one by one.".into()),
        );
    }
    if params.n_features.is_some() && !matches!(features, FeatureColumns::Sparse { .. }) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            "\"n_features\" applies to sparse features only",
            Some("Dense features take their dimension from the data.".into()),
        );
    }
    // Every process of a parallel training holds its own model: they share the setting.
    let model_limit = match mode {
        Mode::Train => crate::pg::guc::model_bytes_for(params.workers, params.n_models()),
        _ => max_model_bytes(),
    };
    if let Some(n) = params.n_features {
        // Before reading a row: the model this asks for must fit (softmax has at least 2 classes).
        let min_outputs = kind.min_outputs() as u64;
        crate::pg::guc::check_model_size(
            n as u64,
            min_outputs,
            model_limit,
            "the n_features param",
        );
    }
    let predicate = match (&params.validation, mode) {
        (Some(Validation::Predicate(p)), Mode::Train) => Some(p.as_str()),
        _ => None,
    };
    let input = query::resolve(
        relid,
        &relname,
        kind,
        &features,
        &params.label,
        params.index_base as i64,
        params.n_features,
        predicate,
        params.filter.as_deref(),
        match stored_preprocess {
            Some(p) => Tabular::Stored(p),
            None => Tabular::Train {
                options: &params.preprocess,
                numbers: kind.family().default_number_encoding(),
                normalize: params.normalize,
                max_categories: params.max_categories,
                max_model_bytes: model_limit,
            },
        },
        params.only,
        group_by,
    );
    if mode == Mode::Train {
        crate::exec::sgd::check_inference_params(&params, input.layout);
    }
    if params.workers > 0 && mode == Mode::Train {
        crate::pipeline::check_distributed(
            Distributed::Workers,
            kind,
            input.label,
            input.layout,
            &params,
        );
    }
    let validation_split = match (&params.validation, input.validation_column, mode) {
        (_, Some(c), Mode::Train) => ValidationSplit::Column(c),
        (Some(Validation::Fraction(f)), _, Mode::Train) => ValidationSplit::Fraction(*f),
        _ => ValidationSplit::None,
    };
    Prepared {
        relid,
        table,
        config: PipelineConfig {
            mode,
            model: kind,
            layout: input.layout,
            label: input.label,
            validation_split,
            known_classes,
            params,
            max_buffer_bytes: max_buffer_bytes(),
            max_model_bytes: model_limit,
            leaf: None,
            groups: input.groups.clone(),
            read_from: None,
            relation: relname,
            preprocess: input.preprocess.clone(),
        },
        input,
    }
}

pub(crate) fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}
