//! Request preparation: from a SQL call's relation, model kind and params to a checked
//! pipeline config and the one query that reads the rows.

pub mod query;
