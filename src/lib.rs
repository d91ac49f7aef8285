//! corgipile: SGD training inside PostgreSQL without a full data shuffle (CorgiPile, SIGMOD 2022).
//!
//! Layers, from the SQL surface down: a folder imports only folders listed after it (no two
//! source files import each other in a circle, and no two folders import each other:
//! `scripts/check_imports.py`):
//! - `sql`, `predict`, `shuffle_table`: the SQL functions users call;
//! - `shard`: trainings spread over shard servers;
//! - `request`: a call's relation, model kind and params → a checked pipeline config and query;
//! - `exec`: the three CustomScan nodes, BlockShuffle → TupleShuffle → SGD, the plan that stacks
//!   them (planner hook), running it, and a parallel worker's entry point;
//! - `parallel`: the team of parallel workers a training's SGD node leads (shared memory, the
//!   epochs' meeting points);
//! - `decode`: rows → labels, features and encoded column lists (training and prediction);
//! - `catalog`: the model tables, names, grants and locks, the model a warm start continues;
//! - `pipeline`: the types every layer shares: the config every node carries, label kinds and
//!   class values, what a training produces, what shard servers and their coordinator send;
//! - `pg`: ERRORs, the differences between majors, settings, the progress line, relation
//!   names.
//!
//! The ML itself (model kinds and families, SGD and the training policy, shuffles, statistics,
//! params, metrics) is the `corgipile_ml` crate, which has no PostgreSQL in it. README.md's Development section
//! maps every file.

use pgrx::prelude::*;

mod catalog;
mod decode;
mod exec;
mod parallel;
mod pg;
mod pipeline;
mod predict;
mod request;
mod shard;
mod shuffle_table;
mod sql;

pgrx::pg_module_magic!();

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    pg::guc::register();
    exec::register_methods();
    exec::plan::install_hook();
}

extension_sql_file!("../sql/catalog.sql", name = "catalog", bootstrap);

/// Required by `cargo pgrx test`; unused by our own test suites.
#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}
    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec![]
    }
}
