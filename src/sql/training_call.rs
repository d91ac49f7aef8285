//! The one preparation of a training call, shared by `corgipile_train`, `corgipile_train_query`
//! and `corgipile_explain`: the params parsed once (with what a warm start takes from its
//! model), the input spilled when it must be, the validation relation read, the request
//! resolved and every combination checked, before any work. The SQL functions run what it
//! returns and stay thin.

use crate::catalog::warm_start::WarmStart;
use crate::exec::sgd::{CollectedRows, Learn};
use crate::pg::error::{raise, refuse_combination};
use crate::pipeline::Mode;
use crate::request::args::ParamsArg;
use crate::request::sharded_view::ShardedView;
use crate::request::since::{self, TableRead};
use crate::request::{parse_model, parse_params, prepare, Prepared};
use crate::shard::Leaf;
use corgipile_ml::capabilities::{used, Use};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{TrainParams, Validation};
use pgrx::prelude::*;
use pgrx::PgSqlErrorCode;

/// What a training reads: a relation's pages, or the rows of a query spilled into a temporary
/// table first (stored as `stored_as`: the view's name, or the query).
pub(super) enum Input {
    Relation(pg_sys::Oid),
    /// A simple view over a sharded table: its table's shards read, in the table's terms.
    ShardedView(ShardedView),
    Spill {
        select: String,
        stored_as: String,
    },
}

impl Input {
    /// The relation whose rows are read: None for a query's (spilled into a temporary table
    /// when the training is prepared).
    pub(super) fn relation(&self) -> Option<pg_sys::Oid> {
        match self {
            Input::Relation(relid) => Some(*relid),
            Input::ShardedView(view) => Some(view.base),
            Input::Spill { .. } => None,
        }
    }

    /// A relation named in a call: its pages, or, for a view of several tables, its rows.
    pub(super) fn of_relation(relid: pg_sys::Oid) -> Input {
        // Before a spill, which would read the shards' rows through postgres_fdw.
        if let Some(view) = crate::request::sharded_view::on_shards(relid) {
            return Input::ShardedView(view);
        }
        match crate::request::view::must_spill(relid) {
            Some(view) => Input::Spill {
                select: format!("SELECT * FROM {view}"),
                stored_as: view,
            },
            None => Input::Relation(relid),
        }
    }
}

/// A call's kind and params, parsed once, and the model a warm start (or `since`) continues.
pub(super) struct Call {
    pub(super) kind: ModelKind,
    pub(super) params: TrainParams,
    pub(super) warm: Option<WarmStart>,
    /// The params hold out rows and stop on them by default (`"patience": "auto"` not given).
    pub(super) stops_early_by_default: bool,
}

impl Call {
    /// The params of a training of `model`, with what a warm start (or `since`, which continues
    /// its model) takes from its model where the params are silent: features, label, name and
    /// a network's or factorization machine's shape (another shape asked for is an ERROR).
    pub(super) fn parse(model: &str, given: &ParamsArg) -> Call {
        let kind = parse_model(model);
        let params = parse_params(given, kind);
        let (params, warm) = match &params.warm_start {
            Some(key) => {
                let mut json = given.0.clone();
                let warm = WarmStart::load(key, kind, &mut json);
                let params = parse_params(&ParamsArg(json), kind);
                warm.check_shape(kind, &params);
                (params, Some(warm))
            }
            None => (params, None),
        };
        let stops_early_by_default = crate::request::stops_early_by_default(given, &params);
        Call {
            kind,
            params,
            warm,
            stops_early_by_default,
        }
    }
}

/// A training call, prepared and checked: what `corgipile_train` runs and stores, and what
/// `corgipile_explain` shows.
pub(super) struct TrainingCall {
    pub(super) kind: ModelKind,
    pub(super) warm: Option<WarmStart>,
    pub(super) prepared: Prepared,
    /// The temporary table a view or query was spilled into, and the name it is stored as.
    pub(super) spilled: Option<(pg_sys::Oid, String)>,
    /// The rows of a validation relation, encoded as the training's.
    pub(super) validation_rows: Option<CollectedRows>,
    /// What this training reads of its table, recorded for a later `since` (a table only).
    pub(super) read_now: Option<TableRead>,
    /// The table's shards, when it is sharded.
    pub(super) sharded: Option<Vec<Leaf>>,
    /// The features it reads, as stored with its model.
    pub(super) features: serde_json::Value,
}

impl TrainingCall {
    /// Prepares `call` on `input`. With `reads_rows` false (a plain EXPLAIN) nothing is read:
    /// a spill is created empty and a validation relation is not read.
    pub(super) fn prepare(call: Call, input: &Input, reads_rows: bool) -> TrainingCall {
        // SAFETY: FFI calls, and reads of what they return, on the backend thread inside the transaction
        // of the SQL call (every caller is a SQL function); no raw pointer comes from the caller.
        unsafe {
            let Call {
                kind,
                mut params,
                warm,
                stops_early_by_default,
            } = call;
            let (relid, spilled) = match input {
                Input::Relation(relid) => (*relid, None),
                Input::ShardedView(view) => {
                    view.rewrite(&mut params);
                    (view.base, None)
                }
                Input::Spill { select, stored_as } => {
                    if params.since.is_some() {
                        raise(
                        PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                        "\"since\" reads what was added to a table; a query or a view of several tables has no pages of its own",
                        Some("Train the query without \"since\" (\"warm_start\" continues a model), or materialize it into a table you append to.".into()),
                    );
                    }
                    let seed = params.seed.unwrap_or_else(crate::request::random_seed);
                    let shown = if select == stored_as {
                        "the training query".to_owned()
                    } else {
                        stored_as.clone()
                    };
                    let (temp, _rows) =
                        crate::shuffle_table::spill::spill(select, seed, reads_rows, &shown);
                    crate::shuffle_table::spill::see_spill();
                    (temp, Some((temp, stored_as.clone())))
                }
            };
            let sharded = crate::shard::sharded_leaves(relid);
            if sharded.is_some() && stops_early_by_default {
                // A gate needs held-out rows, which a network's default holds out only on one
                // server.
                if params.deploy.is_some() {
                    raise(
                        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                        "\"deploy\": \"if_better\" needs held-out rows: \"validation\"",
                        Some("On a sharded table a network holds out no rows by default: add e.g. \"validation\": {\"fraction\": 0.1}.".into()),
                    );
                }
                params.without_early_stopping();
            }
            // A column list with a validation relation: the preprocessing is learned first (its
            // own statistics pass), so that the validation rows are encoded with it. A warm start
            // (or "since") keeps its model's preprocessing and classes. A sharded training reads
            // its validation relation after its round 0 (`shard::gate`).
            let one_server = sharded.is_none();
            let learned = match (&params.validation, params.features.is_tabular()) {
                _ if warm.is_some() => warm.as_ref().and_then(|w| w.stored.preprocessing.clone()),
                (Some(Validation::Relation(_)), true) if reads_rows && one_server => {
                    let mut p = params.clone();
                    p.validation = None;
                    Some(prepare(relid, kind, p, Mode::Train, Vec::new(), None).run(Learn))
                }
                _ => None,
            };
            let validation_rows = match &params.validation {
                Some(Validation::Relation(name)) if reads_rows && one_server => {
                    Some(crate::request::validation_relation::collect_relation(
                        name,
                        kind,
                        &params,
                        learned.as_ref(),
                        Vec::new(),
                    ))
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
            // Before the scan begins, so that pages added during it are read again next time,
            // never missed.
            let read_now = TableRead::now(prepared.table).filter(|_| spilled.is_none());
            if sharded.is_some() {
                check_sharded(&prepared);
                // Each shard reads its own table's added pages (`shard::since`): the model's
                // marks of them checked now, before any work.
                crate::shard::since::load(&prepared.config, prepared.relid);
            } else {
                since::apply(&mut prepared);
                take_buffer_floor(&mut prepared, kind);
                if stops_early_by_default {
                    cap_default_validation(&mut prepared);
                }
            }
            let features = features_read(&prepared);
            // A continued training (`warm_start`, `since`) reads its model's features.
            if let Some(w) = &warm {
                w.check_features(&features);
            }
            TrainingCall {
                kind,
                warm,
                prepared,
                spilled,
                validation_rows,
                read_now,
                sharded,
                features,
            }
        }
    }

    /// Drops the temporary table of a spilled input.
    ///
    /// # Safety
    /// `spilled` is what [`prepare`](Self::prepare) of this call returned, passed once: with a
    /// spill, it pops the snapshot `prepare`'s `see_spill` pushed.
    pub(super) unsafe fn finish(spilled: Option<(pg_sys::Oid, String)>) {
        if let Some((temp, _)) = spilled {
            crate::shuffle_table::spill::unsee_spill();
            crate::shuffle_table::spill::drop_spill(temp);
        }
    }
}

/// A default buffer (`buffer_size` not given) of at least the floor of every model family the
/// call trains (see `BufferSize::at_least`), decided here from the table's size so that the
/// params stored with the model name the buffer it trained on (a search's configurations, each
/// trained alone with its stored params, get the buffers they had side by side).
fn take_buffer_floor(prepared: &mut Prepared, kind: ModelKind) {
    let params = &mut prepared.config.params;
    if params.buffer_size_explicit {
        return;
    }
    let kinds = params
        .search
        .as_ref()
        .map_or_else(|| vec![kind], |s| s.kinds(kind));
    let floor = kinds
        .iter()
        .map(|k| k.family().default_buffer_floor())
        .max()
        .unwrap_or(0);
    if floor == 0 {
        return;
    }
    // The table's pages with its TOAST data, or its partitions' (an estimate of what the block
    // scan reads: the percentage is what is stored); a table that is not partitioned has no
    // partition tree.
    let bytes = Spi::get_one_with_args::<i64>(
        "SELECT coalesce(sum(pg_catalog.pg_table_size(relid)), pg_catalog.pg_table_size($1))::pg_catalog.int8 FROM pg_catalog.pg_partition_tree($1)",
        &[prepared.table.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(0);
    params.buffer_size = params.buffer_size.at_least(floor, bytes.max(0) as u64);
    // A search's configurations are read from its base params: they take the same buffer.
    let size = params.to_json()["buffer_size"].clone();
    if let Some(search) = &mut params.search {
        search.base.insert("buffer_size".into(), size);
    }
}

/// The most rows the default validation split holds out (`"patience": "auto"`'s 10%): a
/// loss measured on 20,000 rows is precise enough to stop on, and 10% of a big table would not
/// fit in memory (an encoded row of 18 piecewise-linear columns takes about 1.8 kB).
const AUTO_VALIDATION_MAX_ROWS: f64 = 20_000.0;

/// The default validation split of a big table: 10% of its rows, but at most
/// [`AUTO_VALIDATION_MAX_ROWS`] of them, by the planner's row estimate of the table or its
/// partitions (or, for a table never analyzed, its size at 64 bytes a row: rather fewer
/// held-out rows than too many). The
/// fraction is stored in the params, as if the call had given it.
fn cap_default_validation(prepared: &mut Prepared) {
    let Some(Validation::Fraction(fraction)) = prepared.config.params.validation else {
        return;
    };
    let rows = Spi::get_one_with_args::<f64>(
        "SELECT CASE WHEN sum(c.reltuples) FILTER (WHERE c.reltuples >= 0) > 0 \
                     THEN sum(c.reltuples) FILTER (WHERE c.reltuples >= 0) \
                     ELSE sum(pg_catalog.pg_table_size(c.oid)) / 64.0 END::pg_catalog.float8 \
         FROM pg_catalog.pg_class c \
         WHERE c.relkind IN ('r', 'm') \
           AND (c.oid = $1 OR c.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree($1)))",
        &[prepared.table.into()],
    )
    .ok()
    .flatten()
    .unwrap_or(0.0);
    if rows * fraction <= AUTO_VALIDATION_MAX_ROWS {
        return;
    }
    // Rounded down to 4 significant digits, so the stored params read well.
    let capped = AUTO_VALIDATION_MAX_ROWS / rows;
    let scale = 10f64.powi(3 - capped.log10().floor() as i32);
    let capped = ((capped * scale).floor() / scale).max(f64::MIN_POSITIVE);
    prepared.config.params.validation = Some(Validation::Fraction(capped));
    prepared.config.validation_split = crate::pipeline::ValidationSplit::Fraction(capped);
}

/// What a training on a sharded table cannot do yet (the capability table), refused before any
/// work: each shard trains one model in one process and keeps no folds (refused, not silently
/// dropped).
fn check_sharded(prepared: &Prepared) {
    let params = &prepared.config.params;
    let uses = used(&[
        (Use::GroupBy, params.group_by.is_some()),
        (Use::Folds, params.folds.is_some()),
        (Use::Workers, params.workers > 0),
        (Use::Search, params.search.is_some()),
    ]);
    refuse_combination(Use::Shards, &uses);
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
