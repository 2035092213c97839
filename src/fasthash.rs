//! The hasher for the maps the proxy touches on every call: those keyed by
//! its own downstream ids and by what the client sends (request ids, call
//! fingerprints, idempotency keys, cache keys).
//!
//! std's default SipHash resists collision flooding by whoever chooses the
//! keys. Here the keys come from the proxy itself or from the client that
//! launched it, and SipHash was a fifth of the dispatcher's work per
//! `tools/call`. [`FastMap`] uses rustc-hash's `FxHasher` instead (the hash
//! rustc uses: a multiply-and-add per word, a folded-multiply hash for byte
//! strings). Maps keyed by names the server chooses (tool annotations) keep
//! the default hasher. Only speed depends on the hash: nothing iterates
//! these maps in an order that matters.

#![forbid(unsafe_code)]

use std::collections::HashMap;

/// A `HashMap` with rustc-hash's `FxHasher`; make one with
/// `FastMap::default()`.
pub type FastMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash<T: std::hash::Hash + ?Sized>(v: &T) -> u64 {
        rustc_hash::FxBuildHasher.hash_one(v)
    }

    #[test]
    fn equal_keys_hash_alike_and_borrowed_forms_agree() {
        let owned = String::from("call\0echo\0{\"seq\":1}");
        let shared: std::sync::Arc<str> = owned.as_str().into();
        assert_eq!(hash(&owned), hash("call\0echo\0{\"seq\":1}"));
        assert_eq!(hash(&shared), hash(owned.as_str()));
        assert_ne!(hash("7"), hash("\"7\""));
        assert_ne!(hash("a"), hash("a\0"));
        assert_ne!(hash(&1u64), hash(&2u64));
    }

    #[test]
    fn maps_work_with_it() {
        let mut m: FastMap<String, u64> = FastMap::default();
        for i in 0..10_000u64 {
            m.insert(i.to_string(), i);
        }
        assert!((0..10_000u64).all(|i| m.get(i.to_string().as_str()) == Some(&i)));
        let mut n: FastMap<u64, u64> = FastMap::default();
        n.extend((0..10_000u64).map(|i| (i, i)));
        assert_eq!(n.remove(&4321), Some(4321));
        assert_eq!(n.len(), 9_999);
    }
}
