//! Sets `pg_since = "N"` for every PostgreSQL major N up to the one the crate is built for
//! (feature `pgN`), so that src/compat.rs writes each difference between majors as a range:
//! `#[cfg(pg_since = "16")]` is "PostgreSQL 16 and later", `#[cfg(not(pg_since = "16"))]`
//! "before 16".

const MAJORS: [u32; 6] = [13, 14, 15, 16, 17, 18];

fn main() {
    // Its output depends only on this file and the features (which cargo tracks): without this
    // line cargo reruns it, and rebuilds the crate, whenever any file of the package changes.
    println!("cargo::rerun-if-changed=build.rs");
    let values: Vec<String> = MAJORS.iter().map(|m| format!("\"{m}\"")).collect();
    println!(
        "cargo::rustc-check-cfg=cfg(pg_since, values({}))",
        values.join(", ")
    );
    let built = MAJORS
        .iter()
        .copied()
        .find(|m| std::env::var_os(format!("CARGO_FEATURE_PG{m}")).is_some());
    for m in MAJORS.iter().filter(|&&m| Some(m) <= built) {
        println!("cargo::rustc-cfg=pg_since=\"{m}\"");
    }
}
