//! corgipile: SGD training inside PostgreSQL without a full data shuffle (CorgiPile, SIGMOD 2022).
//!
//! Layout: `api` holds the training/evaluation SQL functions, `predict` the prediction ones,
//! `manage` model names, deployment and export, `progress` what pg_stat_activity shows; `plan` builds the BlockShuffle → TupleShuffle → SGD
//! executor tree through the planner, `exec` holds the three CustomScan nodes, `catalog` the
//! model tables, `shard` training over tables sharded across servers. The pure ML (models, SGD, shuffling, params) is the `corgipile_ml` crate.

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
    pipeline::plan::install_hook();
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
