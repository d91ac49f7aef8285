//! corgipile_train, and what shows a training without storing it: corgipile_explain and
//! corgipile_trace.

use crate::catalog::groups::{store_groups, SmallGroups};
use crate::catalog::search::store_search;
use crate::catalog::{
    check_schema_version, check_writable, lock_model_name, store_model_with, ModelSource,
};
use crate::exec::explain;
use crate::exec::sgd::{Collect, CollectedRows, Learn, Trace, Train};
use crate::pg::error::{raise, raise_train_error, refuse_combination};
use crate::pg::names::qualified_name;
use crate::pipeline::plan::plan_pipeline;
use crate::pipeline::run::Pipeline;
use crate::pipeline::{Mode, Trial};
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::since::{self, TableRead};
use crate::request::warm_start::WarmStart;
use crate::request::{parse_model, parse_params, prepare, random_seed, Prepared};
use crate::shard::{explain_sharded, train_sharded};
use corgipile_ml::capabilities::{used, Use};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{Features as FeatureSpec, TrainParams, Validation};
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::trials::cross_validation;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ffi::CStr;

/// Trains a model on `relation` and stores it in corgipile.models; returns the model id.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_train(relation: RelationArg, model: &str, params: default!(ParamsArg, "'{}'")) -> i64 {
    // SAFETY: a catalog lookup on the backend thread, inside a transaction.
    let input = match unsafe { crate::request::view::must_spill(relation.oid()) } {
        Some(view) => Input::Spill {
            select: format!("SELECT * FROM {view}"),
            stored_as: view,
        },
        None => Input::Relation(relation.oid()),
    };
    train(input, model, params)
}

/// Trains a model on the rows of a query (one SELECT that locks no row, run as the caller),
/// spilled through the pile shuffle into a temporary table first; returns the model id.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_train_query(query: &str, model: &str, params: default!(ParamsArg, "'{}'")) -> i64 {
    train(
        Input::Spill {
            select: query.to_owned(),
            stored_as: query.to_owned(),
        },
        model,
        params,
    )
}

/// What a training reads: a relation's pages, or the rows of a query spilled into a temporary
/// table first (stored as `stored_as`: the view's name, or the query).
enum Input {
    Relation(pg_sys::Oid),
    Spill { select: String, stored_as: String },
}

/// The params of a training of `kind`, with what a warm start (or `since`, which continues its
/// model) takes from its model where the params are silent: features, label and name.
fn params_with_warm_start(given: &ParamsArg, kind: ModelKind) -> (TrainParams, Option<WarmStart>) {
    let params = parse_params(given, kind);
    let (params, warm) = match &params.warm_start {
        Some(key) => {
            let mut json = given.0.clone();
            let warm = WarmStart::load(key, kind, &mut json);
            (parse_params(&ParamsArg(json), kind), Some(warm))
        }
        None => (params, None),
    };
    (params, warm)
}

/// What a training on a sharded table cannot do yet (the capability table), refused before any
/// work: each shard trains one model in one process and keeps no folds (refused, not silently
/// dropped).
fn check_sharded(prepared: &Prepared, warm: Option<&WarmStart>) {
    let params = &prepared.config.params;
    let uses = used(&[
        (Use::GroupBy, params.group_by.is_some()),
        (Use::Since, params.since.is_some()),
        (Use::WarmStart, warm.is_some()),
        (Use::Folds, params.folds.is_some()),
        (Use::Workers, params.workers > 0),
        (Use::Search, params.search.is_some()),
    ]);
    refuse_combination(Use::Shards, &uses);
}

/// What a continued training (`warm_start`, `since`) cannot do, refused before any work:
/// features other than its model's.
fn check_continued(prepared: &Prepared, warm: Option<&WarmStart>) {
    if let Some(w) = warm {
        w.check_features(&features_read(prepared));
    }
}

/// The features a training reads, as stored with its model: a column list as the columns
/// read ("*" expanded).
fn features_read(prepared: &Prepared) -> serde_json::Value {
    if prepared.config.preprocess.is_some() {
        serde_json::json!(prepared.input.columns)
    } else {
        prepared.config.params.to_json()["features"].clone()
    }
}

fn train(input: Input, model: &str, params: ParamsArg) -> i64 {
    let kind = parse_model(model);
    let (params, warm) = params_with_warm_start(&params, kind);
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
        let (relid, spilled) = match &input {
            Input::Relation(relid) => (*relid, None),
            Input::Spill { select, stored_as } => {
                if params.since.is_some() {
                    raise(
                        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                        "\"since\" reads what was added to a table; a query or a view of several tables has no pages of its own",
                        Some("Train the query without \"since\" (\"warm_start\" continues a model), or materialize it into a table you append to.".into()),
                    );
                }
                let seed = params.seed.unwrap_or_else(random_seed);
                let shown = if select == stored_as {
                    "the training query".to_owned()
                } else {
                    stored_as.clone()
                };
                let (temp, _rows) = crate::shuffle_table::spill::spill(select, seed, true, &shown);
                crate::shuffle_table::spill::see_spill();
                (temp, Some((temp, stored_as.clone())))
            }
        };
        // A list of columns with a validation relation: the preprocessing is learned first
        // (its own statistics pass), so that the validation rows are encoded with it.
        let learned = match (&params.validation, params.features.is_tabular()) {
            // A column list keeps the preprocessing of the model it continues.
            _ if warm.is_some() => warm.as_ref().and_then(|w| w.stored.preprocessing.clone()),
            (Some(Validation::Relation(_)), true) => {
                let mut p = params.clone();
                p.validation = None;
                Some(prepare(relid, kind, p, Mode::Train, Vec::new(), None).run(Learn))
            }
            _ => None,
        };
        let validation_rows = match &params.validation {
            Some(Validation::Relation(name)) => {
                Some(collect_relation(name, kind, &params, learned.as_ref()))
            }
            _ => None,
        };
        // Class indices of the validation rows (or of a warm start's model) and of the
        // training rows must agree.
        let known_classes = match &warm {
            Some(w) => w.classes(),
            None => validation_rows
                .as_ref()
                .map(|v| v.classes.clone())
                .unwrap_or_default(),
        };
        let mut prepared = prepare(
            relid,
            kind,
            params,
            Mode::Train,
            known_classes,
            learned.as_ref(),
        );
        // What this training reads of its table, recorded for a later "since"; before the
        // scan begins, so that pages added during it are read again next time, never missed.
        let read_now = TableRead::now(prepared.table).filter(|_| spilled.is_none());
        since::apply(&mut prepared);
        let sharded = crate::shard::sharded_leaves(prepared.relid);
        if sharded.is_some() {
            check_sharded(&prepared, warm.as_ref());
        }
        check_continued(&prepared, warm.as_ref());
        let features = features_read(&prepared);
        let trials = match sharded {
            Some(leaves) => vec![Trial::only(
                &prepared.config.params,
                train_sharded(&prepared, leaves).0,
            )],
            None => prepared.run(Train {
                validation_rows,
                relid: prepared.table,
                sql: prepared.input.sql.clone(),
                warm_start: warm,
            }),
        };
        let params = &prepared.config.params;
        let source = ModelSource {
            model: kind,
            relation: &match &spilled {
                Some((_, stored_as)) => stored_as.clone(),
                None => qualified_name(prepared.relid),
            },
            label_column: &params.label,
            features,
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
        };
        let stored = if params.search.is_some() {
            store_search(&source, trials, params.selection(kind))
        } else if let Some(columns) = &params.group_by {
            let (groups, rows) = trials[0].small_groups.unwrap_or_default();
            store_groups(
                &source,
                trials,
                columns,
                params.min_group_rows.unwrap_or(1),
                SmallGroups { groups, rows },
            )
        } else {
            let trial = trials
                .into_iter()
                .next()
                .expect("a training that does not search has one configuration");
            // With folds, the model of every row can diverge while its folds' models go on.
            let outcome = trial
                .outcome
                .unwrap_or_else(|e| raise_train_error(e, &|v| v.to_string(), params.normalize));
            let mut extra = serde_json::Map::new();
            if let Some(read) = read_now {
                extra.insert("read".into(), read.to_json());
            }
            if !trial.cv.is_empty() {
                extra.insert("cv".into(), cross_validation(&trial.cv));
            }
            store_model_with(&source, &outcome, extra)
        };
        if let Some((temp, _)) = spilled {
            crate::shuffle_table::spill::unsee_spill();
            crate::shuffle_table::spill::drop_spill(temp);
        }
        stored
    }
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
    let mut params = parse_params(&params, corgipile_ml::model::reading_kind());
    params.double_buffer = false;
    params.verbose = false;
    // SAFETY: as in corgipile_train.
    let visited = unsafe {
        let prepared = prepare(
            relation.oid(),
            corgipile_ml::model::reading_kind(),
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
    let (mut params, warm) = params_with_warm_start(&params, kind);
    // EXPLAIN ANALYZE trains without the per-epoch NOTICEs.
    params.verbose = false;
    // SAFETY: as in corgipile_train; the ExplainState lives in the current memory context.
    let text = unsafe {
        // A view of several tables: trained from its rows spilled into a temporary table
        // (filled only for EXPLAIN ANALYZE, which trains).
        let spilled = crate::request::view::must_spill(relation.oid()).map(|view| {
            let select = format!("SELECT * FROM {view}");
            let seed = params.seed.unwrap_or_else(random_seed);
            let (temp, _) = crate::shuffle_table::spill::spill(&select, seed, analyze, &view);
            crate::shuffle_table::spill::see_spill();
            (temp, view)
        });
        let relid = spilled.as_ref().map_or(relation.oid(), |(temp, _)| *temp);
        // A warm start (or "since") keeps its model's classes and preprocessing, as training.
        let (known_classes, learned) = match &warm {
            Some(w) => (w.classes(), w.stored.preprocessing.clone()),
            None => (Vec::new(), None),
        };
        let mut prepared = prepare(
            relid,
            kind,
            params,
            Mode::Train,
            known_classes,
            learned.as_ref(),
        );
        since::apply(&mut prepared);
        let sharded = crate::shard::sharded_leaves(prepared.relid);
        if sharded.is_some() {
            check_sharded(&prepared, warm.as_ref());
        }
        check_continued(&prepared, warm.as_ref());
        if let Some(leaves) = sharded {
            let text = explain_sharded(&prepared, leaves, analyze, explain_format);
            let rows = match explain_format {
                pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT => {
                    text.lines().map(str::to_owned).collect()
                }
                _ => vec![text],
            };
            return SetOfIterator::new(rows);
        }
        let continues = warm.as_ref().map(|w| w.stored.id);
        let stmt = plan_pipeline(prepared.table, &prepared.input.sql, &prepared.config);
        let mut pipeline = Pipeline::start(stmt, &prepared.input.sql, analyze, !analyze);
        let started = std::time::Instant::now();
        if analyze {
            pipeline.sgd_node().verbose = false;
            pipeline.run_task(Train {
                validation_rows: None,
                relid: prepared.table,
                sql: prepared.input.sql.clone(),
                warm_start: warm,
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
        if let Some((_, view)) = &spilled {
            explain::text(
                es,
                "Input",
                &format!("{view}, spilled through the pile shuffle into a temporary table (a uniform random order) before the epochs"),
            );
        }
        if let Some(id) = continues {
            explain::text(es, "Warm Start", &format!("from model {id}"));
        }
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
        if let Some((temp, _)) = spilled {
            crate::shuffle_table::spill::unsee_spill();
            crate::shuffle_table::spill::drop_spill(temp);
        }
        text
    };
    let rows = match explain_format {
        pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT => text.lines().map(str::to_owned).collect(),
        _ => vec![text],
    };
    SetOfIterator::new(rows)
}
