//! The SQL functions: training, prediction, evaluation, EXPLAIN.

use crate::catalog::{
    check_schema_version, check_writable, lock_model_name, store_model, ModelSource,
};
use crate::exec::explain;
use crate::exec::sgd::{
    binary_labels, Collect, CollectedRows, Evaluate, EvaluateRequest, EvaluateShard, Learn, Phase,
    RoundReply, RoundRequest, SgdTask, ShardRound, Trace, Train,
};
use crate::pg::error::raise;
use crate::pg::guc::{max_buffer_bytes, max_model_bytes};
use crate::pipeline::classes::ClassValue;
use crate::pipeline::decode::{ParamsArg, RelationArg};
use crate::pipeline::plan::plan_pipeline;
use crate::pipeline::run::{self, Pipeline};
use crate::pipeline::{Distributed, Holdout, Mode, PipelineConfig};
use crate::predict::{load_model_ref, ModelRef};
use crate::request::query::{
    self as query, check_relation, qualified_name, relation_name, FeatureColumns, Input, Tabular,
};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{Features as FeatureSpec, TrainParams, Validation};
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::scoring::Evaluation;
use corgipile_ml::wire;
use pgrx::prelude::*;
use pgrx::{JsonB, PgSqlErrorCode};
use std::ffi::CStr;

/// A checked request: the config every node gets and the query BlockShuffle runs.
struct Prepared {
    relid: pg_sys::Oid,
    config: PipelineConfig,
    input: Input,
}

impl Prepared {
    /// Plans and runs the pipeline with `task`; its output.
    unsafe fn run<T: SgdTask>(&self, task: T) -> T::Output {
        run::run(self.relid, &self.input.sql, &self.config, task)
    }
}

fn parse_model(model: &str) -> ModelKind {
    ModelKind::parse(model).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown model \"{model}\""),
            Some(format!(
                "Valid models are: {}.",
                ModelKind::all_names().join(", ")
            )),
        )
    })
}

fn parse_params(params: &ParamsArg) -> TrainParams {
    let mut params = TrainParams::from_json(&params.0).unwrap_or_else(|e| {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            e.message,
            e.hint,
        )
    });
    if params.seed.is_none() {
        params.seed = Some(random_seed());
    }
    params
}

fn feature_columns(spec: &FeatureSpec) -> FeatureColumns {
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
unsafe fn prepare(
    relid: pg_sys::Oid,
    kind: ModelKind,
    params: TrainParams,
    mode: Mode,
    known_classes: Vec<ClassValue>,
    stored_preprocess: Option<&Preprocessor>,
) -> Prepared {
    let relname = relation_name(relid);
    check_relation(relid, &relname, params.only);
    let mut features = feature_columns(&params.features);
    if let FeatureColumns::All { exclude } = &mut features {
        exclude.clone_from(&params.exclude);
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
        Mode::Train => crate::pg::guc::model_bytes_for(params.workers),
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
        match stored_preprocess {
            Some(p) => Tabular::Stored(p),
            None => Tabular::Train {
                options: &params.preprocess,
                normalize: params.normalize,
                max_categories: params.max_categories,
                max_model_bytes: model_limit,
            },
        },
        params.only,
    );
    if params.workers > 0 && mode == Mode::Train {
        crate::pipeline::check_distributed(
            Distributed::Workers,
            kind,
            input.label,
            input.layout,
            &params,
        );
    }
    let holdout = match (&params.validation, input.validation_column, mode) {
        (_, Some(c), Mode::Train) => Holdout::Column(c),
        (Some(Validation::Fraction(f)), _, Mode::Train) => Holdout::Fraction(*f),
        _ => Holdout::None,
    };
    Prepared {
        relid,
        config: PipelineConfig {
            mode,
            model: kind,
            layout: input.layout,
            label: input.label,
            holdout,
            known_classes,
            params,
            max_buffer_bytes: max_buffer_bytes(),
            max_model_bytes: model_limit,
            leaf: None,
            relation: relname,
            preprocess: input.preprocess.clone(),
        },
        input,
    }
}

/// A seed for a call that gave none (it is stored or reported, so the run can be repeated).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    // Stored as a JSON integer that also fits a bigint.
    h.finish() & (i64::MAX as u64)
}

/// Trains a model on `relation` and stores it in corgipile.models; returns the model id.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_train(relation: RelationArg, model: &str, params: default!(ParamsArg, "'{}'")) -> i64 {
    let kind = parse_model(model);
    let params = parse_params(&params);
    check_schema_version();
    // What would fail at the end fails now, before any work.
    check_writable(c"corgipile_train()");
    // A version of another owner's name needs "manage" on it: checked before any work.
    let target_name = params
        .name
        .as_deref()
        .map(crate::catalog::grants::training_name);
    if let Some(name) = &target_name {
        lock_model_name(name);
    }
    // SAFETY: catalog lookups and executor calls on the backend thread, inside a transaction.
    unsafe {
        // A list of columns with a validation relation: the preprocessing is learned first
        // (its own statistics pass), so that the validation rows are encoded with it.
        let learned = match (&params.validation, params.features.is_tabular()) {
            (Some(Validation::Relation(_)), true) => {
                let mut p = params.clone();
                p.validation = None;
                Some(prepare(relation.oid(), kind, p, Mode::Train, Vec::new(), None).run(Learn))
            }
            _ => None,
        };
        let validation_rows = match &params.validation {
            Some(Validation::Relation(name)) => {
                Some(collect_relation(name, kind, &params, learned.as_ref()))
            }
            _ => None,
        };
        // Class indices of the validation rows and of the training rows must agree.
        let known_classes = validation_rows
            .as_ref()
            .map(|v| v.classes.clone())
            .unwrap_or_default();
        let prepared = prepare(
            relation.oid(),
            kind,
            params,
            Mode::Train,
            known_classes,
            learned.as_ref(),
        );
        let outcome = match crate::shard::sharded_leaves(prepared.relid) {
            Some(leaves) => train_sharded(&prepared, leaves).0,
            None => prepared.run(Train {
                validation_rows,
                relid: prepared.relid,
                sql: prepared.input.sql.clone(),
            }),
        };
        let params = &prepared.config.params;
        store_model(
            &ModelSource {
                model: kind,
                relation: &qualified_name(prepared.relid),
                label_column: &params.label,
                // A column list is stored as the columns read ("*" expanded).
                features: if prepared.config.preprocess.is_some() {
                    serde_json::json!(prepared.input.columns)
                } else {
                    params.to_json()["features"].clone()
                },
                label_type: if prepared.input.label_is_bool {
                    "boolean"
                } else if prepared.config.label.uses_classes()
                    && matches!(
                        prepared.config.label,
                        crate::pipeline::LabelCoding::ClassOfText
                    )
                {
                    "text"
                } else {
                    "numeric"
                },
                params: params.to_json(),
                name: target_name.as_ref(),
            },
            &outcome,
        )
    }
}

/// A training over a sharded table (postgres_fdw partitions): the shards train, this backend
/// combines (see `crate::shard`).
unsafe fn train_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
) -> (crate::pipeline::TrainOutcome, crate::shard::ShardSummary) {
    let config = &prepared.config;
    crate::shard::check_supported(config.model, config);
    check_sharded_access(prepared.relid, &config.relation, "train on");
    let kind = config.model;
    let params = config.params.clone();
    let parent = prepared.relid;
    let run_local = |leaf: pg_sys::Oid, request: &RoundRequest| {
        shard_round_here(parent, Some(leaf), kind, &params, request)
    };
    crate::shard::train(leaves, config, &run_local)
}

/// The shards read their tables as the user mappings' roles; here the caller must be allowed to
/// read the partitioned table, and its row-level security (which the shards cannot apply) must
/// not be in force. `what`: "train on" or "evaluate on", for the message.
unsafe fn check_sharded_access(relid: pg_sys::Oid, relation: &str, what: &str) {
    if pg_sys::pg_class_aclcheck(
        relid,
        pg_sys::GetUserId(),
        pg_sys::ACL_SELECT as pg_sys::AclMode,
    ) != pg_sys::AclResult::ACLCHECK_OK
    {
        raise(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("permission denied for table {relation}"),
            None,
        );
    }
    if pg_sys::check_enable_rls(relid, pg_sys::InvalidOid, true)
        == pg_sys::CheckEnableRlsResult::RLS_ENABLED as i32
    {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!("cannot {what} the sharded table {relation}: its row-level security would not apply on the shards"),
            Some("Define the policies on the shards' tables, for the roles the user mappings name.".into()),
        );
    }
}

/// EXPLAIN of a training over a sharded table: no executor plan runs here, so the output is the
/// training's properties and its shards; with `analyze`, after training (the model is not
/// stored), each shard's tuples in the last epoch and time, and the bytes exchanged per epoch.
unsafe fn explain_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    analyze: bool,
    format: pg_sys::ExplainFormat::Type,
) -> String {
    crate::shard::check_supported(prepared.config.model, &prepared.config);
    let described = crate::shard::describe(&leaves);
    let params = &prepared.config.params;
    let started = std::time::Instant::now();
    let trained = analyze.then(|| train_sharded(prepared, leaves));
    let es = pg_sys::NewExplainState();
    (*es).analyze = analyze;
    (*es).format = format;
    pg_sys::ExplainBeginOutput(es);
    pg_sys::ExplainOpenGroup(c"Query".as_ptr(), std::ptr::null(), true, es);
    explain::text(es, "Sharded Training", &prepared.config.relation);
    explain::text(es, "Model", prepared.config.model.name());
    explain::int(es, "Epochs", params.epochs as i64);
    explain::text(
        es,
        "Sync",
        &match params.sync {
            Some(n) => format!("{n} rounds per epoch"),
            None => {
                "auto (64 rounds per epoch, fewer for a model of more than 16384 weights)".into()
            }
        },
    );
    explain::int(es, "Shards", described.len() as i64);
    match &trained {
        None => {
            for (i, d) in described.iter().enumerate() {
                explain::text(es, &format!("Shard {}", i + 1), d);
            }
        }
        Some((outcome, summary)) => {
            for (i, (line, d)) in summary.shards.iter().zip(&described).enumerate() {
                explain::text(
                    es,
                    &format!("Shard {}", i + 1),
                    &format!(
                        "{d}: {} tuples in the last epoch, {:.3} s in rounds",
                        line.tuples_last_epoch, line.seconds
                    ),
                );
            }
            explain::int(es, "Rounds Per Epoch", summary.rounds_per_epoch as i64);
            explain::int(es, "Epochs Run", outcome.epochs.len() as i64);
            if let Some(last) = outcome.epochs.last() {
                explain::float(es, "Final Loss", None, last.stats.loss, 6);
                explain::int(es, "Tuples Per Epoch", last.stats.tuples as i64);
            }
            explain::int(es, "Bytes Per Epoch", summary.bytes_per_epoch as i64);
            let times: Vec<String> = outcome
                .epochs
                .iter()
                .map(|e| format!("{:.3}", e.seconds * 1000.0))
                .collect();
            explain::text(es, "Epoch Times (ms)", &times.join(", "));
            explain::float(
                es,
                "Training Time",
                Some("ms"),
                started.elapsed().as_secs_f64() * 1000.0,
                3,
            );
        }
    }
    pg_sys::ExplainCloseGroup(c"Query".as_ptr(), std::ptr::null(), true, es);
    pg_sys::ExplainEndOutput(es);
    CStr::from_ptr((*(*es).str_).data)
        .to_string_lossy()
        .into_owned()
}

/// Runs a shard's round on a table of this server: `relid` itself (a shard server's table), or
/// with `leaf`, that local partition of the sharded table `relid`, read as a SELECT on `relid`
/// reads it.
unsafe fn shard_round_here(
    relid: pg_sys::Oid,
    leaf: Option<pg_sys::Oid>,
    kind: ModelKind,
    params: &TrainParams,
    request: &RoundRequest,
) -> RoundReply {
    let mut params = params.clone();
    params.verbose = false;
    params.workers = 0;
    if request.phase == Phase::Evaluate {
        return evaluate_shard_here(relid, leaf, kind, params, request);
    }
    let mut prepared = prepare(relid, kind, params, Mode::Train, Vec::new(), None);
    prepared.config.leaf = leaf.map(u32::from);
    crate::shard::check_supported(kind, &prepared.config);
    prepared.run(ShardRound {
        request: request.clone(),
    })
}

/// A shard's part of an evaluation: the coordinator's model scored on this server's rows (of
/// `relid`, or its partition `leaf`, as `shard_round_here`).
unsafe fn evaluate_shard_here(
    relid: pg_sys::Oid,
    leaf: Option<pg_sys::Oid>,
    kind: ModelKind,
    params: TrainParams,
    request: &RoundRequest,
) -> RoundReply {
    let Some(EvaluateRequest {
        model,
        classes,
        preprocessing,
    }) = &request.evaluate
    else {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            "corgipile shard round: an evaluation without a model",
            None,
        )
    };
    // A model of another kind or shape than it says would score out of bounds.
    let outputs = kind.outputs_for(classes.len());
    if model.kind != kind
        || model.n_outputs != outputs
        || model.n_features.checked_mul(outputs) != Some(model.weights.len())
        || model.bias.len() != outputs
        || preprocessing
            .as_ref()
            .is_some_and(|p| p.n_features != model.n_features)
    {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            "corgipile shard round: the coordinator's model has another shape",
            None,
        );
    }
    let mut prepared = prepare(
        relid,
        kind,
        params,
        Mode::Evaluate,
        classes.clone(),
        preprocessing.as_ref(),
    );
    prepared.config.leaf = leaf.map(u32::from);
    let (part, rows_skipped) = prepared.run(EvaluateShard {
        model: model.clone(),
        classes: classes.clone(),
    });
    RoundReply {
        rows: part.rows_scored(),
        rows_skipped,
        evaluation: Some(part),
        ..RoundReply::default()
    }
}

/// A shard server's part of a training over a sharded table: called by the coordinator
/// through the user mapping's connection. Returns the round's result as JSON; stores nothing.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_shard_round(
    relation: RelationArg,
    model: &str,
    params: ParamsArg,
    request: &str,
) -> String {
    let kind = parse_model(model);
    let params = parse_params(&params);
    check_schema_version();
    // Whoever may call this function may have written the request: its size is bounded before
    // it is parsed (four times corgipile.max_model_memory: it carries one model), its
    // shapes and values are checked before anything is allocated from them.
    let hint = || {
        Some("corgipile_shard_round is called by a coordinator server training over a sharded table.".into())
    };
    let request: RoundRequest =
        wire::parse_bounded(request.as_bytes(), crate::pg::guc::max_wire_bytes()).unwrap_or_else(|e| match e {
            wire::WireError::TooLarge { .. } => raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("corgipile shard request of {} bytes: {e} (corgipile.max_model_memory)", request.len()),
                Some("A coordinator's request carries one model: raise corgipile.max_model_memory on this server if the model is really that large.".into()),
            ),
            wire::WireError::Invalid(why) => raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid corgipile shard request: {why}"),
                hint(),
            ),
        });
    let version = env!("CARGO_PKG_VERSION");
    if request.version != version {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "the coordinator runs corgipile {}, this shard {version}",
                request.version
            ),
            Some("Install the same corgipile version on every server.".into()),
        );
    }
    // Sharded trainings are binary or regression models (one output); an evaluation's model
    // says its own outputs.
    let outputs = match &request.evaluate {
        Some(e) => e.model.n_outputs.max(1),
        None => 1,
    };
    if let Err(why) = request.check(outputs) {
        // Well-formed JSON, but not what a coordinator sends: a protocol violation.
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("corgipile shard round: {why}"),
            hint(),
        );
    }
    let n_features = match &request.evaluate {
        Some(e) => e.model.n_features,
        None => request.n_features,
    };
    crate::pg::guc::check_model_size(
        n_features as u64,
        outputs as u64,
        max_model_bytes(),
        "the coordinator's request",
    );
    // SAFETY: as corgipile_train.
    let reply = unsafe { shard_round_here(relation.oid(), None, kind, &params, &request) };
    serde_json::to_string(&reply).expect("reply serializes")
}

/// Reads a validation relation (same columns as the training relation) into memory.
unsafe fn collect_relation(
    name: &str,
    kind: ModelKind,
    params: &TrainParams,
    preprocessing: Option<&Preprocessor>,
) -> CollectedRows {
    let relid = Spi::get_one_with_args::<pg_sys::Oid>(
        "SELECT pg_catalog.to_regclass($1)::pg_catalog.oid",
        &[name.into()],
    )
    .ok()
    .flatten()
    .unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_UNDEFINED_TABLE,
            format!("validation relation \"{name}\" does not exist"),
            None,
        )
    });
    let mut p = params.clone();
    p.validation = None;
    if let Some(prep) = preprocessing {
        // The training's columns ("*" resolved on the training table), by name.
        p.features = FeatureSpec::Columns(prep.column_names().map(str::to_owned).collect());
        p.exclude.clear();
    }
    p.shuffle = corgipile_ml::params::ShuffleMode::NoShuffle;
    p.double_buffer = false;
    let prepared = prepare(relid, kind, p, Mode::Collect, Vec::new(), preprocessing);
    prepared.run(Collect).unwrap_or_else(|| {
        raise(
            PgSqlErrorCode::ERRCODE_NO_DATA_FOUND,
            format!("validation relation \"{name}\" has no usable rows"),
            None,
        )
    })
}

/// Scores a stored model on a relation (read with the same block scan as training). Returns
/// accuracy, precision, recall, F1, ROC AUC and log loss for classifiers (per class and macro
/// for softmax), MSE, RMSE, MAE and R² for linear regression, and the rows scored and skipped.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_evaluate(
    model_id: i64,
    relation: RelationArg,
    params: default!(ParamsArg, "'{}'"),
) -> JsonB {
    evaluate(ModelRef::Id(model_id), relation, params)
}

/// corgipile_evaluate of the deployed version of a model name.
#[pg_extern(volatile, parallel_unsafe, name = "corgipile_evaluate")]
fn corgipile_evaluate_by_name(
    model_name: &str,
    relation: RelationArg,
    params: default!(ParamsArg, "'{}'"),
) -> JsonB {
    evaluate(ModelRef::from_text(model_name), relation, params)
}

fn evaluate(key: ModelRef, relation: RelationArg, params: ParamsArg) -> JsonB {
    let stored = load_model_ref(key);
    let mut overrides = match &params.0 {
        serde_json::Value::Object(map) => map.clone(),
        other => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("params must be a JSON object, got {}", json_type(other)),
            None,
        ),
    };
    for key in overrides.keys() {
        if !["features", "label", "buffer_size", "block_size", "only"].contains(&key.as_str()) {
            raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("unknown parameter \"{key}\" for corgipile_evaluate"),
                Some("valid parameters are: features, label, buffer_size, block_size, only (features and label default to the model's)".into()),
            );
        }
    }
    if stored.preprocessing.is_some()
        && overrides
            .get("features")
            .is_some_and(|f| *f != stored.features)
    {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "model {} reads its feature columns by name: \"features\" cannot be changed",
                stored.id
            ),
            Some(format!(
                "The relation must have the model's columns: {}.",
                stored.features
            )),
        );
    }
    overrides
        .entry("features")
        .or_insert_with(|| stored.features.clone());
    overrides
        .entry("label")
        .or_insert_with(|| serde_json::Value::String(stored.label_column.clone()));
    overrides.insert("index_base".into(), serde_json::json!(stored.index_base));
    overrides.insert("shuffle".into(), serde_json::json!("no_shuffle"));
    overrides.insert("double_buffer".into(), serde_json::json!(false));
    overrides.insert("verbose".into(), serde_json::json!(false));
    overrides.insert("seed".into(), serde_json::json!(0));
    let params = parse_params(&ParamsArg(serde_json::Value::Object(overrides)));
    // SAFETY: as in corgipile_train.
    let report = unsafe {
        let prepared = prepare(
            relation.oid(),
            stored.kind(),
            params,
            Mode::Evaluate,
            stored.classes.clone(),
            stored.preprocessing.as_ref(),
        );
        match crate::shard::sharded_leaves(prepared.relid) {
            Some(leaves) => evaluate_sharded(&prepared, leaves, &stored),
            None => prepared.run(Evaluate {
                model: stored.clone(),
            }),
        }
    };
    JsonB(report)
}

/// corgipile_evaluate on a sharded table: every shard scores the model on its rows; the
/// metrics are merged here.
unsafe fn evaluate_sharded(
    prepared: &Prepared,
    leaves: Vec<crate::shard::Leaf>,
    stored: &crate::catalog::StoredModel,
) -> serde_json::Value {
    let config = &prepared.config;
    check_sharded_access(prepared.relid, &config.relation, "evaluate on");
    let request = EvaluateRequest {
        model: stored.model.clone(),
        classes: stored.classes.clone(),
        preprocessing: stored.preprocessing.clone(),
    };
    let kind = config.model;
    let parent = prepared.relid;
    let run_local = |leaf: pg_sys::Oid, request: &RoundRequest| {
        evaluate_shard_here(parent, Some(leaf), kind, config.params.clone(), request)
    };
    let binary = binary_labels(config.label.uses_classes(), &stored.classes);
    let mut evaluation = Evaluation::mergeable(kind, stored.classes.len(), binary);
    let rows_skipped = crate::shard::evaluate(leaves, config, request, &run_local, &mut evaluation);
    let mut report = evaluation.finish(rows_skipped);
    report["model_id"] = serde_json::json!(stored.id);
    report
}

/// The order in which SGD would see the rows of `relation` in epoch 1 under `params` (the
/// shuffle strategy, block and buffer sizes, seed): position, label and first feature of each
/// visited row. For studying strategies (the paper's Figures 3 and 4); trains nothing.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_trace(
    relation: RelationArg,
    params: default!(ParamsArg, "'{}'"),
) -> TableIterator<
    'static,
    (
        name!(position, i64),
        name!(label, f64),
        name!(first_feature, f64),
    ),
> {
    let mut params = parse_params(&params);
    params.double_buffer = false;
    params.verbose = false;
    // SAFETY: as in corgipile_train.
    let visited = unsafe {
        let prepared = prepare(
            relation.oid(),
            ModelKind::Linear,
            params,
            Mode::Trace,
            Vec::new(),
            None,
        );
        prepared.run(Trace)
    };
    TableIterator::new(
        visited
            .into_iter()
            .enumerate()
            .map(|(i, (label, first))| (i as i64 + 1, label, first)),
    )
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// The EXPLAIN of the training plan; with `analyze`, after running the training (the model is
/// not stored). `format` is text (one row per line), json, yaml or xml (one row).
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_explain(
    relation: RelationArg,
    model: &str,
    params: default!(ParamsArg, "'{}'"),
    analyze: default!(bool, false),
    format: default!(&str, "'text'"),
) -> SetOfIterator<'static, String> {
    let kind = parse_model(model);
    let explain_format = match format.to_ascii_lowercase().as_str() {
        "text" => pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT,
        "json" => pg_sys::ExplainFormat::EXPLAIN_FORMAT_JSON,
        "yaml" => pg_sys::ExplainFormat::EXPLAIN_FORMAT_YAML,
        "xml" => pg_sys::ExplainFormat::EXPLAIN_FORMAT_XML,
        _ => raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("unknown EXPLAIN format \"{format}\""),
            Some("Valid formats are text, json, yaml and xml.".into()),
        ),
    };
    let mut params = parse_params(&params);
    // EXPLAIN ANALYZE trains without the per-epoch NOTICEs.
    params.verbose = false;
    // SAFETY: as in corgipile_train; the ExplainState lives in the current memory context.
    let text = unsafe {
        let prepared = prepare(relation.oid(), kind, params, Mode::Train, Vec::new(), None);
        if let Some(leaves) = crate::shard::sharded_leaves(prepared.relid) {
            let text = explain_sharded(&prepared, leaves, analyze, explain_format);
            let rows = match explain_format {
                pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT => {
                    text.lines().map(str::to_owned).collect()
                }
                _ => vec![text],
            };
            return SetOfIterator::new(rows);
        }
        let stmt = plan_pipeline(prepared.relid, &prepared.input.sql, &prepared.config);
        let mut pipeline = Pipeline::start(stmt, &prepared.input.sql, analyze, !analyze);
        let started = std::time::Instant::now();
        if analyze {
            pipeline.sgd_node().verbose = false;
            pipeline.run_task(Train {
                validation_rows: None,
                relid: prepared.relid,
                sql: prepared.input.sql.clone(),
            });
        }
        let es = pg_sys::NewExplainState();
        (*es).analyze = analyze;
        (*es).costs = true;
        (*es).buffers = analyze;
        (*es).timing = analyze;
        (*es).format = explain_format;
        // The same groups as ExplainOnePlan, so JSON/YAML/XML are well formed.
        pg_sys::ExplainBeginOutput(es);
        pg_sys::ExplainOpenGroup(c"Query".as_ptr(), std::ptr::null(), true, es);
        pg_sys::ExplainPrintPlan(es, pipeline.query_desc);
        if analyze {
            explain::float(
                es,
                "Training Time",
                Some("ms"),
                started.elapsed().as_secs_f64() * 1000.0,
                3,
            );
        }
        pg_sys::ExplainCloseGroup(c"Query".as_ptr(), std::ptr::null(), true, es);
        pg_sys::ExplainEndOutput(es);
        let text = CStr::from_ptr((*(*es).str_).data)
            .to_string_lossy()
            .into_owned();
        pipeline.finish();
        text
    };
    let rows = match explain_format {
        pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT => text.lines().map(str::to_owned).collect(),
        _ => vec![text],
    };
    SetOfIterator::new(rows)
}
