//! The hand-written hash functions, one copy of each: FNV-1a, the two 64-bit finalizers
//! (murmur3's fold-multiply-fold, splitmix64's mix) and splitmix64 itself. Written out, not
//! std's hashers (whose output may change between Rust releases): stored models (hashed
//! category buckets), advisory lock keys shared by every backend and the validation split
//! depend on these exact outputs. Never change one. (Hash maps whose hash is never stored use
//! foldhash.) A leaf: imports nothing from the crate.

/// FNV-1a's 64-bit offset basis.
pub const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's 64-bit prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// 2^64 / φ, splitmix64's increment (and a common odd multiplier for spreading seeds).
pub const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// FNV-1a (64-bit) over `bytes`. Its low bits are poorly spread: finish it with
/// [`fold_mul_fold`] or [`splitmix64_mix`] before taking a remainder.
#[inline]
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h = FNV_OFFSET_BASIS;
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
    }
    h
}

/// Folds the high half of `h` down: `h ^= h >> 33; h *= 0xff51afd7ed558ccd; h ^= h >> 33`
/// (the first half of murmur3's fmix64), so the low bits depend on the high ones.
#[inline]
pub fn fold_mul_fold(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

/// splitmix64's output function (Stafford's Mix13): every output bit depends on every input
/// bit.
#[inline]
pub fn splitmix64_mix(mut h: u64) -> u64 {
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// One splitmix64 output for the state `x`: [`splitmix64_mix`] of `x + GOLDEN_GAMMA`.
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    splitmix64_mix(x.wrapping_add(GOLDEN_GAMMA))
}

/// The hasher of maps whose hash is never stored (category and group lookups): foldhash, a
/// fraction of SipHash's cost on short keys (flooding is no concern for a map built from the
/// owner's own table), with a fixed seed so that a map's order is the same in every process.
pub type MapHasher = foldhash::fast::FixedState;

#[cfg(test)]
mod tests {
    use super::*;

    /// The functions as they were written before they were gathered here, verbatim (but for
    /// their names and the pg_sys types of `tid_fraction`): the reference for bit-identity.
    mod old {
        // ml/src/preprocess.rs
        pub fn bucket(value: &[u8], buckets: u32) -> usize {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &b in value {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h ^= h >> 33;
            h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
            h ^= h >> 33;
            (h % buckets as u64) as usize
        }

        // src/catalog/locks.rs (the purpose's marker byte given directly)
        pub fn name_hash(marker: u8, name: &str) -> u64 {
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            for b in [marker, 0xff].into_iter().chain(name.bytes()) {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
            h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            h ^ (h >> 31)
        }

        // src/decode/mod.rs, tid_fraction (the ctid's fields and the table oid given directly)
        pub fn tid_fraction(bi_hi: u16, bi_lo: u16, posid: u16, table: Option<u32>) -> f64 {
            let block = (bi_hi as u64) << 16 | bi_lo as u64;
            let salt = table.map_or(0, |t| (t as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
            let mut x = (block << 16 | posid as u64) ^ salt;
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^= x >> 31;
            (x >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// How the callers compose the functions here (preprocess's `bucket`, locks.rs's
    /// `name_hash`, tuple_shuffle's `tid_fraction`).
    fn bucket(value: &[u8], buckets: u32) -> usize {
        (fold_mul_fold(fnv1a(value.iter().copied())) % buckets as u64) as usize
    }

    fn name_hash(marker: u8, name: &str) -> u64 {
        splitmix64_mix(fnv1a([marker, 0xff].into_iter().chain(name.bytes())))
    }

    fn tid_fraction(bi_hi: u16, bi_lo: u16, posid: u16, table: Option<u32>) -> f64 {
        let block = (bi_hi as u64) << 16 | bi_lo as u64;
        let salt = table.map_or(0, |t| (t as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
        let x = splitmix64((block << 16 | posid as u64) ^ salt);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }

    #[test]
    fn known_outputs() {
        // Computed by the old code before the move: stored models and lock keys depend on them.
        let cases: [(&[u8], usize, usize); 5] = [
            (b"", 82, 2951903813),
            (b"a", 589, 110826284),
            (b"user17", 394, 65371773),
            (b"New York", 609, 1318224065),
            (b"\xff\x00zero-padded code 0001", 944, 4119205843),
        ];
        for (value, b1024, bmax) in cases {
            assert_eq!(bucket(value, 1024), b1024, "{value:?}");
            assert_eq!(bucket(value, u32::MAX), bmax, "{value:?}");
        }
        for (marker, name, want) in [
            (1, "", 0xc93a_6068_b560_760e),
            (1, "churn", 0x6260_1212_2ecf_cffd),
            (2, "churn", 0xd6b9_3095_5600_2189),
            (3, "Model Ä", 0xb155_11a1_fa27_74f9),
            (4, "x", 0xae62_416e_c71c_771a),
        ] {
            assert_eq!(name_hash(marker, name), want, "{marker} {name}");
        }
        for (hi, lo, pos, table, bits) in [
            (0, 0, 1, None, 0x3fe2_2145_bd91_204b),
            (0, 7, 3, None, 0x3fe5_249a_fd75_a6d6),
            (1, 2, 40, Some(16384), 0x3fe6_b8fd_8e3f_262c),
            (65535, 65535, 65535, Some(u32::MAX), 0x3fba_9f49_f238_95e8),
        ] {
            assert_eq!(tid_fraction(hi, lo, pos, table).to_bits(), bits);
        }
    }

    #[test]
    fn equal_to_the_old_code_on_random_inputs() {
        let mut state = 12345u64;
        let mut next = || {
            state = state.wrapping_add(1);
            splitmix64(state)
        };
        for _ in 0..5_000 {
            let len = (next() % 40) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let buckets = (next() as u32).max(1);
            assert_eq!(bucket(&bytes, buckets), old::bucket(&bytes, buckets));
            let name = String::from_utf8_lossy(&bytes);
            let marker = (next() % 4 + 1) as u8;
            assert_eq!(name_hash(marker, &name), old::name_hash(marker, &name));
            let r = next();
            let table = (r & 1 == 1).then_some((r >> 32) as u32);
            let (hi, lo, pos) = (r as u16, (r >> 16) as u16, (r >> 40) as u16);
            assert_eq!(
                tid_fraction(hi, lo, pos, table).to_bits(),
                old::tid_fraction(hi, lo, pos, table).to_bits()
            );
        }
    }
}
