//! corgipile_train, and what shows a training without storing it: corgipile_explain and
//! corgipile_trace.

use super::gate::{before_storing, record_training, Gate};
use super::training_call::{Call, Input, TrainingCall};
use crate::catalog::groups::{store_groups, SmallGroups};
use crate::catalog::search::store_search;
use crate::catalog::{
    check_schema_version, check_writable, lock_model_name, store_model_with, ModelSource,
};
use crate::exec::explain;
use crate::exec::plan::plan_pipeline;
use crate::exec::run::Pipeline;
use crate::exec::sgd::{Trace, Train, Trained};
use crate::pg::error::{raise, raise_train_error};
use crate::pg::names::qualified_name;
use crate::pipeline::Mode;
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::{parse_params, prepare};
use crate::shard::gate::HeldOut;
use crate::shard::{explain_sharded, train_sharded};
use corgipile_ml::trials::cross_validation;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;
use std::ffi::CStr;
use std::sync::Arc;

/// Trains a model on `relation` and stores it in corgipile.models; returns the model id.
#[pg_extern(volatile, parallel_unsafe)]
fn corgipile_train(relation: RelationArg, model: &str, params: default!(ParamsArg, "'{}'")) -> i64 {
    train(Input::of_relation(relation.oid()), model, params)
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

fn train(input: Input, model: &str, params: ParamsArg) -> i64 {
    let call = Call::parse(model, &params);
    check_schema_version();
    // What would fail at the end fails now, before any work.
    check_writable(c"corgipile_train()");
    // A version of another owner's name needs "manage" on it: checked before any work.
    let target_name = call
        .params
        .name
        .as_deref()
        .map(crate::catalog::grants::training_name);
    if let Some(name) = &target_name {
        lock_model_name(name);
    }
    // "deploy": "if_better": the deployed version checked against this training, before any
    // work (src/sql/gate.rs).
    let mut gate = Gate::prepare(
        call.kind,
        &call.params,
        target_name.as_ref(),
        input.relation(),
    );
    {
        let TrainingCall {
            kind,
            warm,
            prepared,
            spilled,
            mut validation_rows,
            read_now,
            sharded,
            features,
        } = TrainingCall::prepare(call, &input, true);
        if let Some(gate) = &mut gate {
            gate.held_out_in(target_name.as_ref(), prepared.relid);
        }
        // A validation relation's rows: which they are, for the gate.
        let relation_held_out = validation_rows.as_mut().and_then(|v| v.held_out.take());
        // What a sharded training read of its shards' tables (`shard::since`), and the rows the
        // gate scores on: by tuple id here, or kept on the shards.
        let mut read_now = read_now.map(|r| r.to_json());
        let (trials, held_out) = match sharded {
            Some(leaves) => {
                let (trials, summary, held_out) = train_sharded(&prepared, leaves, warm.as_ref());
                read_now = summary.read;
                (trials, held_out)
            }
            None => {
                let Trained { trials, held_out } = prepared.run(Train {
                    validation_rows,
                    relid: prepared.table,
                    sql: prepared.input.sql.clone(),
                    warm_start: warm,
                    record_held_out: gate.is_some(),
                    profile_predictions: true,
                });
                let held_out = relation_held_out.or(held_out);
                (trials, held_out.map(|r| HeldOut::Rows(Arc::new(r))))
            }
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
        // The version the name meant before this training's is stored (its deploy lock held
        // from here to the end of the transaction).
        let before = target_name.as_ref().map(before_storing);
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
                extra.insert("read".into(), read);
            }
            if !trial.cv.is_empty() {
                extra.insert("cv".into(), cross_validation(&trial.cv));
            }
            store_model_with(&source, &outcome, extra)
        };
        // Which version the name means now, and why: a row of corgipile.deployments (before
        // a spilled input's table is dropped: the gate reads its held-out rows).
        if let (Some(n), Some(before)) = (&target_name, before) {
            match gate {
                Some(gate) => gate.decide(n, before, stored, held_out),
                None => record_training(n, before, stored),
            }
        }
        // SAFETY: `spilled` is what this call's TrainingCall::prepare returned, passed once.
        unsafe { TrainingCall::finish(spilled) };
        stored
    }
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
    let visited = {
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
    let mut call = Call::parse(model, &params);
    // EXPLAIN ANALYZE trains without the per-epoch NOTICEs.
    call.params.verbose = false;
    // SAFETY: as in corgipile_train; the ExplainState lives in the current memory context.
    let text = unsafe {
        // A view of several tables is trained from its rows spilled into a temporary table
        // (filled only for EXPLAIN ANALYZE, which trains).
        let TrainingCall {
            warm,
            prepared,
            spilled,
            validation_rows,
            sharded,
            ..
        } = TrainingCall::prepare(call, &Input::of_relation(relation.oid()), analyze);
        if let Some(leaves) = sharded {
            let text = explain_sharded(&prepared, leaves, warm.as_ref(), analyze, explain_format);
            TrainingCall::finish(spilled);
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
                validation_rows,
                relid: prepared.table,
                sql: prepared.input.sql.clone(),
                warm_start: warm,
                record_held_out: false,
                // Nothing is stored: no pass beyond the training's.
                profile_predictions: false,
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
        pg_sys::ExplainPrintPlan(es, pipeline.query_desc());
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
        TrainingCall::finish(spilled);
        text
    };
    let rows = match explain_format {
        pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT => text.lines().map(str::to_owned).collect(),
        _ => vec![text],
    };
    SetOfIterator::new(rows)
}
