//! The SQL functions users call: training (with EXPLAIN and trace), evaluation, model
//! management. Prediction is `crate::predict`, the table shuffle `crate::shuffle_table`, a shard
//! server's round `crate::shard::serve`.

/// The two SQL overloads of a function of a stored model, by id and by name (the name's
/// deployed version; an integer text is an id), one Rust function each (pgrx's way: the Rust
/// names are the C symbols the install and upgrade scripts name, so they never change). Both
/// call `$body` with the model's [`ModelRef`](crate::catalog::ModelRef) as `$key`. Types are
/// passed as tokens (`{ ... }`) so that pgrx sees its `name!` and `default!` markers.
macro_rules! by_id_and_name {
    (
        $(#[doc = $doc:literal])*
        #[pg_extern($($attr:tt)*)]
        fn $by_id:ident / $by_name:ident ($($arg:ident: {$($arg_ty:tt)+}),*) -> {$($out:tt)+}
        |$key:ident| $body:expr
    ) => {
        $(#[doc = $doc])*
        #[allow(clippy::type_complexity)] // the SQL result's columns, as pgrx spells them
        #[pg_extern($($attr)*)]
        fn $by_id(model_id: i64, $($arg: $($arg_ty)+),*) -> $($out)+ {
            let $key = crate::catalog::ModelRef::Id(model_id);
            $body
        }

        $(#[doc = $doc])*
        ///
        /// By name: the name's deployed version.
        #[allow(clippy::type_complexity)] // the SQL result's columns, as pgrx spells them
        #[pg_extern($($attr)*)]
        fn $by_name(model_name: &str, $($arg: $($arg_ty)+),*) -> $($out)+ {
            let $key = crate::catalog::ModelRef::from_text(model_name);
            $body
        }
    };
}

pub mod drift;
pub mod evaluate;
pub mod export;
mod gate;
pub mod importance;
pub mod manage;
pub mod tables;
pub mod train;
mod training_call;
