//! The shard server's side: `corgipile_shard_round`, called by a coordinator through the user
//! mapping's connection, runs one round on a table of this server.

use crate::catalog::check_schema_version;
use crate::exec::sgd::{held_out_ids, score_held_out, EvaluateShard, ShardRound, TrainingTable};
use crate::pg::error::raise;
use crate::pg::guc::max_model_bytes;
use crate::pipeline::protocol::{
    EvaluateRequest, LearnerReply, Phase, RoundReply, RoundRequest, Versions, PROTOCOL,
};
use crate::pipeline::{FeatureLayout, Mode};
use crate::request::args::{ParamsArg, RelationArg};
use crate::request::{parse_model, parse_params, prepare};
use corgipile_ml::model::{Likelihood, ModelKind, Predictor};
use corgipile_ml::params::{Features as FeatureSpec, TrainParams};
use corgipile_ml::preprocess::Preprocessor;
use corgipile_ml::scoring::BinaryLabels;
use corgipile_ml::trained::Model;
use corgipile_ml::wire;
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// Runs a shard's round on a table of this server: `relid` itself (a shard server's table), or
/// with `leaf`, that local partition of the sharded table `relid`, read as a SELECT on `relid`
/// reads it.
pub(super) fn shard_round_here(
    relid: pg_sys::Oid,
    leaf: Option<pg_sys::Oid>,
    kind: ModelKind,
    params: &TrainParams,
    request: &RoundRequest,
) -> RoundReply {
    let mut params = params.clone();
    params.verbose = false;
    params.workers = 0;
    let table = TrainingTable {
        training: request.training,
        relid: u32::from(relid),
        leaf: leaf.map(u32::from),
    };
    match request.phase {
        Phase::Evaluate => return evaluate_shard_here(relid, leaf, kind, params, request),
        Phase::Importance => {
            let (model, evaluate) = coordinator_model(kind, request);
            let params = reading(params, evaluate);
            return super::importance::importance_here(relid, leaf, kind, params, request, model);
        }
        Phase::Validate => return validate_here(table, kind, request),
        Phase::Inference => check_newton_pass(kind, &params, request),
        Phase::Statistics | Phase::Train => {}
    }
    // The classes in the coordinator's numbering (a network's: `NetworkRound`; a softmax's or
    // a text label's: `RoundRequest::classes`): this shard's decoder numbers labels so.
    let classes = match &request.network {
        Some(n) => n.classes.clone(),
        None => request.classes.clone(),
    };
    let numbered = !classes.is_empty();
    // A list of feature columns: the statistics round reads them on the coordinator's wall
    // clock; a training round encodes them with the coordinator's preprocessing, by name.
    if let (Phase::Statistics, Some(zone)) = (request.phase, &request.zone) {
        use_time_zone(zone);
    }
    let preprocessing = request.preprocessing.as_ref();
    if let Some(p) = preprocessing {
        params.features = by_name(p);
        params.exclude.clear();
    }
    let mut prepared = prepare(relid, kind, params, Mode::Train, classes, preprocessing);
    prepared.config.leaf = leaf.map(u32::from);
    crate::shard::check_supported(kind, &prepared.config);
    super::groups::number_as_sent(&mut prepared.config, request);
    let mark = super::since::mark_here(leaf.unwrap_or(relid), request, &mut prepared.config);
    // Rounds that read the training's rows as its epochs do (a training's, a Newton pass's).
    let reads_training_rows = matches!(request.phase, Phase::Train | Phase::Inference);
    // (A preprocessing makes the features its columns: a list.)
    if reads_training_rows
        && preprocessing.is_none()
        && prepared.config.layout == FeatureLayout::Tabular
    {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            "corgipile shard round: a round of a list of feature columns without the coordinator's preprocessing",
            None,
        );
    }
    // A linear model's round of a label numbered by class needs the coordinator's numbering
    // (the shard's own would differ), and only such a round has one.
    if reads_training_rows
        && request.network.is_none()
        && (numbered != prepared.config.label.uses_classes()
            || (numbered && kind.is_binary() && request.classes.len() != 2))
    {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            if numbered {
                "corgipile shard round: classes for a label that is not numbered by class"
            } else {
                "corgipile shard round: a round of a label numbered by class without the coordinator's classes"
            },
            None,
        );
    }
    let reply = prepared.run(ShardRound {
        request: request.clone(),
        table,
    });
    // The statistics round's reply says what this training read of the table (`since`).
    match request.phase {
        Phase::Statistics => RoundReply { mark, ..reply },
        _ => reply,
    }
}

/// A Newton pass round is of a model with a likelihood (logistic: its two labels as the
/// trainer saw them) whose information matrix fits corgipile.max_model_memory here, with the
/// intercept as the params say: else a protocol violation, or ERROR 54000, before any row is
/// read.
fn check_newton_pass(kind: ModelKind, params: &TrainParams, request: &RoundRequest) {
    let ask = request
        .inference
        .as_ref()
        .expect("checked with the request");
    let fits = match kind.head().likelihood {
        Some(Likelihood::Logistic) => request.extras.label_values.is_some(),
        Some(Likelihood::Linear) => true,
        None => false,
    };
    if !fits || ask.bias.is_some() != params.fit_intercept {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!(
                "corgipile shard round: a Newton pass of a {} model of another shape",
                kind.name()
            ),
            None,
        );
    }
    crate::exec::sgd::check_information_size(
        request.n_features,
        params.fit_intercept,
        max_model_bytes(),
    );
}

/// A shard's part of a validation round: each learner's model of the epoch scored on the rows
/// this backend held out of `table` in the training's first epoch (no read of the table).
fn validate_here(table: TrainingTable, kind: ModelKind, request: &RoundRequest) -> RoundReply {
    let binary = request
        .extras
        .label_values
        .map(|(negative, positive)| BinaryLabels::Values { negative, positive });
    let learners = request
        .learners
        .iter()
        .map(|learner| {
            let Some(score) = &learner.score else {
                no_model()
            };
            let model = checked_model(kind, score);
            LearnerReply {
                validation: Some(score_held_out(table, &model, binary)),
                ..LearnerReply::default()
            }
        })
        .collect();
    RoundReply {
        learners,
        ..RoundReply::default()
    }
}

fn no_model() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
        "corgipile shard round: an evaluation without a model",
        None,
    )
}

/// The model an evaluation request carries to score, checked: of the kind and shape it says.
/// Returns it with the stored request's parts.
fn coordinator_model(kind: ModelKind, request: &RoundRequest) -> (Model, &EvaluateRequest) {
    let Some(evaluate) = &request.evaluate else {
        no_model()
    };
    (checked_model(kind, evaluate), evaluate)
}

/// The model `evaluate` carries (an evaluation's or a validation's), checked: of the kind and
/// shape it says.
fn checked_model(kind: ModelKind, evaluate: &EvaluateRequest) -> Model {
    // A model of another kind or shape than it says would score out of bounds.
    let outputs = kind.outputs_for(evaluate.classes.len());
    let model = evaluate.model.clone().into_model().unwrap_or_else(|why| {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("corgipile shard round: {why}"),
            None,
        )
    });
    if model.kind() != kind
        || model.n_outputs() != outputs
        || evaluate
            .preprocessing
            .as_ref()
            .is_some_and(|p| p.n_features != model.n_features())
    {
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            "corgipile shard round: the coordinator's model has another shape",
            None,
        );
    }
    model
}

/// A shard's part of an evaluation: the coordinator's model scored on this server's rows (of
/// `relid`, or its partition `leaf`, as `shard_round_here`); a gate's, on only the rows the
/// training held out of them.
pub(super) fn evaluate_shard_here(
    relid: pg_sys::Oid,
    leaf: Option<pg_sys::Oid>,
    kind: ModelKind,
    params: TrainParams,
    request: &RoundRequest,
) -> RoundReply {
    let (model, evaluate) = coordinator_model(kind, request);
    let EvaluateRequest {
        classes,
        preprocessing,
        tables,
        held_out,
        ..
    } = evaluate;
    // Kept by this backend since the training's first epoch: none kept (another backend, or a
    // training that kept none) is not "no rows held out".
    let only_rows = held_out.then(|| {
        let table = TrainingTable {
            training: request.training,
            relid: u32::from(relid),
            leaf: leaf.map(u32::from),
        };
        held_out_ids(table).unwrap_or_else(|| {
            raise(
                PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
                "corgipile shard round: no held-out rows of this training are kept here",
                None,
            )
        })
    });
    let params = reading(params, evaluate);
    let mut prepared = prepare(
        relid,
        kind,
        params,
        Mode::Evaluate,
        classes.clone(),
        preprocessing.as_ref(),
    );
    prepared.config.leaf = leaf.map(u32::from);
    if let Some(family) = &evaluate.groups {
        return super::groups::evaluate_family_here(prepared, kind, model, evaluate, family);
    }
    let (part, rows_skipped) = prepared.run(EvaluateShard {
        model,
        classes: classes.clone(),
        tables: *tables,
        only_rows,
    });
    RoundReply {
        rows: part.rows_scored(),
        rows_skipped,
        evaluation: Some(part),
        ..RoundReply::default()
    }
}

/// The params a shard reads the stored model's rows with: a stored preprocessing reads its own
/// columns, by name (`"*"` was resolved when it was learned; the shard's table may have more
/// columns, or another order), and a family's rows are numbered by its group columns.
fn reading(mut params: TrainParams, evaluate: &EvaluateRequest) -> TrainParams {
    if let Some(p) = &evaluate.preprocessing {
        params.features = by_name(p);
        params.exclude.clear();
    }
    if let Some(family) = &evaluate.groups {
        params.group_by = Some(family.columns.clone());
    }
    params
}

/// The columns a preprocessing reads, as a `features` param.
fn by_name(p: &Preprocessor) -> FeatureSpec {
    FeatureSpec::Columns(p.column_names().map(str::to_owned).collect())
}

/// Reads `timestamptz` columns on `zone`'s wall clock for the rest of this call's transaction
/// (a remote shard's session is pinned to UTC; see `remote`): the coordinator's, as its
/// preprocessing plans say. A zone PostgreSQL does not know is its ERROR 22023.
fn use_time_zone(zone: &str) {
    let current = Spi::get_one::<String>("SELECT pg_catalog.current_setting('TimeZone')")
        .ok()
        .flatten();
    if current.as_deref() == Some(zone) {
        return;
    }
    if let Err(e) = Spi::run_with_args(
        "SELECT pg_catalog.set_config('TimeZone', $1, true)",
        &[zone.into()],
    ) {
        raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("corgipile shard round: the coordinator's time zone: {e}"),
            None,
        );
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
    let given = params;
    let mut params = parse_params(&given, kind);
    // A shard takes no validation rows: a network's default stays a fixed number of epochs
    // here (the coordinator sends its params whole; a call that names none gets these).
    if crate::request::stops_early_by_default(&given, &params) {
        params.without_early_stopping();
    }
    check_schema_version();
    // Whoever may call this function may have written the request: its size is bounded before
    // it is parsed (four times corgipile.max_model_memory: it carries its learners' models), its
    // shapes and values are checked before anything is allocated from them.
    let hint = || {
        Some("corgipile_shard_round is called by a coordinator server training over a sharded table.".into())
    };
    let limit = crate::pg::guc::max_wire_bytes();
    let refuse = |e: wire::WireError| -> ! {
        match e {
            wire::WireError::TooLarge { .. } => raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("corgipile shard request of {} bytes: {e} (corgipile.max_model_memory)", request.len()),
                Some("A coordinator's request carries its learners' models (a search's configurations, folds): raise corgipile.max_model_memory on this server if they are really that large.".into()),
            ),
            wire::WireError::Invalid(why) => raise(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid corgipile shard request: {why}"),
                hint(),
            ),
        }
    };
    // The versions first: another version's fields may mean something else (or be missing).
    let versions: Versions =
        wire::parse_bounded(request.as_bytes(), limit).unwrap_or_else(|e| refuse(e));
    if !versions.are_ours() {
        raise(
            PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
            format!(
                "the coordinator runs {}, this shard {}",
                versions.theirs(),
                Versions::ours()
            ),
            Some("Install the same corgipile version on every server (ALTER EXTENSION corgipile UPDATE after installing the same build).".into()),
        );
    }
    debug_assert_eq!(versions.protocol, PROTOCOL);
    let request: RoundRequest =
        wire::parse_bounded(request.as_bytes(), limit).unwrap_or_else(|e| refuse(e));
    // A linear sharded training has one output (binary kinds, regression) or one per class
    // of the coordinator's numbering (softmax); a network's round and an evaluation's model
    // say their own outputs.
    let scored = request
        .evaluate
        .as_ref()
        .or(request.learners.first().and_then(|l| l.score.as_ref()));
    let outputs = match (scored, &request.network) {
        (Some(e), _) => e.model.n_outputs().max(1),
        (None, Some(n)) => n.classes.len().max(1),
        (None, None) if kind.has_class_outputs() && request.phase == Phase::Train => {
            request.classes.len().max(2)
        }
        (None, None) => 1,
    };
    if let Err(why) = request.check(outputs) {
        // Well-formed JSON, but not what a coordinator sends: a protocol violation.
        raise(
            PgSqlErrorCode::ERRCODE_PROTOCOL_VIOLATION,
            format!("corgipile shard round: {why}"),
            hint(),
        );
    }
    let n_features = match scored {
        Some(e) => e.model.n_features(),
        None => request.n_features,
    };
    // Every learner of the round is a model of this shape in memory at once.
    let models = request.learners.len().max(1) as u64;
    crate::pg::guc::check_model_size(
        n_features as u64,
        (outputs as u64).saturating_mul(models),
        max_model_bytes(),
        "the coordinator's request",
    );
    let mut reply = shard_round_here(relation.oid(), None, kind, &params, &request);
    reply.version = crate::pipeline::protocol::this_version().to_string();
    reply.protocol = PROTOCOL;
    serde_json::to_string(&reply).expect("reply serializes")
}
