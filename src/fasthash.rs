//! A fast hasher for the maps the proxy touches on every call: those keyed by
//! its own downstream ids and by what the client sends (request ids, call
//! fingerprints, idempotency keys).
//!
//! std's default SipHash resists collision flooding by whoever chooses the
//! keys. Here the keys come from the proxy itself or from the client that
//! launched it, and SipHash was a fifth of the dispatcher's work per
//! `tools/call`. This is a multiply-and-add hash in the style of rustc's
//! FxHash, eight bytes at a time. Maps keyed by names the server chooses
//! (tool annotations) keep the default hasher. Only speed depends on the hash:
//! nothing iterates these maps in an order that matters.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`FastHasher`]; make one with `FastMap::default()`.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// See the module documentation.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher {
    hash: u64,
}

/// An odd constant with well-spread bits (the one rustc-hash 2 uses).
const K: u64 = 0xf135_7aea_2e62_a9c5;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = self.hash.wrapping_add(word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.add(bytes.len() as u64);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().expect("eight bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The multiply leaves the best-mixed bits at the top; hashbrown takes
        // its bucket index from the bottom.
        self.hash.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash<T: std::hash::Hash + ?Sized>(v: &T) -> u64 {
        BuildHasherDefault::<FastHasher>::default().hash_one(v)
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
