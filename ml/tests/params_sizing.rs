//! Parameter sizes: byte sizes and percentages, and the resolution of block and buffer sizes
//! (pages, tuples) from them.

use corgipile_ml::params::{
    parse_bytes, resolve_block_pages, resolve_buffer_tuples, resolve_buffer_tuples_bytes,
    BlockSize, BufferSize,
};

#[test]
fn parse_bytes_cases() {
    let ok = [
        ("10MB", 10 << 20),
        ("10 MB", 10 << 20),
        (" 10mb ", 10 << 20),
        ("512kB", 512 << 10),
        ("512KB", 512 << 10),
        ("1GB", 1 << 30),
        ("1gb", 1 << 30),
        ("2TB", 2 << 40),
        ("8192B", 8192),
        ("1b", 1),
        ("2.5MB", 2_621_440),
        (".5kB", 512),
        ("1.5B", 2),
        ("007kB", 7 << 10),
    ];
    for (s, want) in ok {
        assert_eq!(parse_bytes(s), Ok(want), "{s}");
    }
    for s in [
        "",
        "MB",
        "10",
        "-10MB",
        "0MB",
        "0.1B",
        "10XB",
        "10 M B",
        "1.2.3MB",
        "abc",
        "10MBs",
        "1e3MB",
        "+5MB",
        "99999999999999999999TB",
    ] {
        assert!(parse_bytes(s).is_err(), "{s:?} should be rejected");
    }
    assert_eq!(parse_bytes("16777215TB"), Ok(16777215 << 40));
    assert!(parse_bytes("16777216TB").is_err()); // 2^64 bytes
}

#[test]
fn resolve_block_pages_rules() {
    // Auto: ~64 blocks on small tables, 10MB (1280 pages) on big ones.
    // Auto: buffer pages / 256, between 1 and 1280, never above the table.
    assert_eq!(resolve_block_pages(BlockSize::Auto, 20, 8192, 2), 1);
    assert_eq!(resolve_block_pages(BlockSize::Auto, 0, 8192, 0), 1);
    assert_eq!(
        resolve_block_pages(BlockSize::Auto, 113_000, 8192, 11_300),
        44
    );
    assert_eq!(
        resolve_block_pages(BlockSize::Auto, 5_000_000, 8192, 500_000),
        1280
    );
    assert_eq!(
        resolve_block_pages(BlockSize::Auto, u32::MAX, 8192, u64::MAX),
        1280
    );
    assert_eq!(
        resolve_block_pages(BlockSize::Auto, 100, 8192, 1_000_000),
        100
    );
    assert_eq!(resolve_block_pages(BlockSize::Pages(16), 1000, 8192, 0), 16);
    assert_eq!(resolve_block_pages(BlockSize::Pages(16), 10, 8192, 0), 10); // capped at the table
    assert_eq!(resolve_block_pages(BlockSize::Pages(16), 0, 8192, 0), 1);
    assert_eq!(
        resolve_block_pages(BlockSize::Bytes(10 << 20), 100_000, 8192, 0),
        1280
    );
    assert_eq!(
        resolve_block_pages(BlockSize::Bytes(100), 100_000, 8192, 0),
        1
    );
    assert_eq!(
        resolve_block_pages(BlockSize::Bytes(1 << 20), 100_000, 16384, 0),
        64
    );
    assert_eq!(
        resolve_block_pages(BlockSize::Bytes(u64::MAX), 5, 8192, 0),
        5
    );
}

#[test]
fn resolve_buffer_tuples_rules() {
    let mb = 1u64 << 20;
    // 9 features → 80 bytes per tuple.
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Fraction(0.1), false, 9, 8000, 2, 512 * mb),
        Ok(10)
    );
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Fraction(0.1), false, 9, 8001, 2, 512 * mb),
        Ok(11)
    ); // ceil
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Fraction(0.1), false, 9, 0, 2, 512 * mb),
        Ok(1)
    );
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Bytes(8000), true, 9, 0, 1, 512 * mb),
        Ok(100)
    );
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Bytes(10), true, 9, 0, 1, 512 * mb),
        Ok(1)
    );
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Tuples(777), true, 9, 0, 2, 512 * mb),
        Ok(777)
    );

    // Default (not explicit) is clamped to the limit: 512MB / 2 buffers / 80 bytes.
    let huge_table = 100u64 << 40;
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Fraction(0.1), false, 9, huge_table, 2, 512 * mb),
        Ok(512 * mb / 2 / 80)
    );
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Tuples(u64::MAX), false, 9, 0, 1, 1),
        Ok(1)
    );
    // Exactly at the limit is fine.
    assert_eq!(
        resolve_buffer_tuples(BufferSize::Tuples(100), true, 9, 0, 2, 16000),
        Ok(100)
    );

    // Explicit sizes over the limit are errors.
    let e = resolve_buffer_tuples(BufferSize::Bytes(1 << 40), true, 9, 0, 2, 512 * mb).unwrap_err();
    assert_eq!(
        e.message,
        "buffer_size of 1TB (13743895347 tuples × 2 buffers × 80 bytes = 2TB) exceeds corgipile.max_buffer_memory (512MB)"
    );
    assert!(e.hint.unwrap().contains("double_buffer"));
    let e = resolve_buffer_tuples(BufferSize::Fraction(0.5), true, 9, huge_table, 1, 512 * mb)
        .unwrap_err();
    assert!(
        e.message.starts_with("buffer_size of 50% of the table ("),
        "{}",
        e.message
    );
    assert_eq!(
        e.hint.as_deref(),
        Some("lower buffer_size or raise corgipile.max_buffer_memory")
    );
    assert!(resolve_buffer_tuples(BufferSize::Tuples(101), true, 9, 0, 2, 16000).is_err());
}

#[test]
fn buffer_tuples_from_bytes_per_tuple() {
    let mb = 1u64 << 20;
    let bpt = corgipile_ml::TupleArena::bytes_per_sparse_tuple(10); // 136
    assert_eq!(
        resolve_buffer_tuples_bytes(BufferSize::Bytes(136_000), true, bpt, 0, 1, 512 * mb),
        Ok(1000)
    );
    assert_eq!(
        resolve_buffer_tuples_bytes(BufferSize::Fraction(0.1), false, 80, 8000, 2, 512 * mb),
        resolve_buffer_tuples(BufferSize::Fraction(0.1), false, 9, 8000, 2, 512 * mb)
    );
}

#[test]
fn a_default_buffer_holds_at_least_its_floor_or_the_table() {
    let mb = 1 << 20;
    let ten = BufferSize::Fraction(0.1);
    // A 4 MB table: all of it; a 400 MB table: 16 MB is less than 10%: 10%; 70 MB: 23%.
    assert_eq!(ten.at_least(16 * mb, 4 * mb), BufferSize::Fraction(1.0));
    assert_eq!(ten.at_least(16 * mb, 400 * mb), ten);
    assert_eq!(ten.at_least(16 * mb, 70 * mb), BufferSize::Fraction(0.23));
    // Sizes in bytes, no floor, an empty table: unchanged.
    assert_eq!(
        BufferSize::Bytes(mb).at_least(16 * mb, 4 * mb),
        BufferSize::Bytes(mb)
    );
    assert_eq!(ten.at_least(0, 4 * mb), ten);
    assert_eq!(ten.at_least(16 * mb, 0), ten);
    // Written back and read again, the same buffer.
    let p = corgipile_ml::params::TrainParams::for_kind(
        &serde_json::json!({"buffer_size": "23%"}),
        corgipile_ml::model::ModelKind::Mlp,
    )
    .unwrap();
    assert_eq!(p.buffer_size, ten.at_least(16 * mb, 70 * mb));
}
