//! Shared copies of the strings many mesh records repeat. At 100k workloads the same few hundred namespaces,
//! service accounts, nodes, canonical names and revisions appear over and over; one `Arc<str>` each, shared by every
//! record that names it, instead of a `String` per record (a workload record went from about 2.0 KB of heap to the
//! figure the `state_mem` example prints).
//!
//! Interned when a record is validated (outside the state's lock); `sweep` drops the strings no record holds any
//! more, after large batches.

use parking_lot::Mutex;
use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

/// A shared string: compares, hashes, orders and serializes as its text (so a `HashMap<Str, _>` is looked up by
/// `&str`), and clones by reference count.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Str(Arc<str>);

impl Str {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `a` and `b` are one allocation.
    pub fn ptr_eq(a: &Str, b: &Str) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }
}

impl Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Str {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Str {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Str {
    /// A new, unshared copy (for unique text such as a uid); `intern` shares.
    fn from(s: &str) -> Str {
        Str(Arc::from(s))
    }
}

impl From<Str> for serde_json::Value {
    fn from(s: Str) -> serde_json::Value {
        serde_json::Value::String(s.to_string())
    }
}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Str {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Str {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Str> for String {
    fn eq(&self, other: &Str) -> bool {
        self.as_str() == &*other.0
    }
}

impl PartialEq<Str> for &str {
    fn eq(&self, other: &Str) -> bool {
        *self == &*other.0
    }
}

impl fmt::Display for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl serde::Serialize for Str {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

fn table() -> &'static Mutex<HashSet<Str>> {
    static TABLE: OnceLock<Mutex<HashSet<Str>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashSet::new()))
}

/// The shared copy of `s`.
/// Deserialized shared (`intern`): for fields whose values repeat across records (localities).
impl<'de> serde::Deserialize<'de> for Str {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Str, D::Error> {
        let s: std::borrow::Cow<'de, str> = serde::Deserialize::deserialize(d)?;
        Ok(intern(&s))
    }
}

pub fn intern(s: &str) -> Str {
    let mut t = table().lock();
    if let Some(found) = t.get(s) {
        return found.clone();
    }
    let new = Str::from(s);
    t.insert(new.clone());
    new
}

/// Forgets the strings only the table still holds. Returns how many are kept.
pub fn sweep() -> usize {
    let mut t = table().lock();
    t.retain(|s| Arc::strong_count(&s.0) > 1);
    t.shrink_to_fit();
    t.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_text_is_one_allocation_and_unused_text_is_swept() {
        let a = intern("ns-intern-test");
        let b = intern(&String::from("ns-intern-test"));
        assert!(Str::ptr_eq(&a, &b));
        assert_eq!(&*a, "ns-intern-test");
        drop((a, b));
        sweep();
        let t = table().lock();
        assert!(!t.contains("ns-intern-test"));
    }
}
