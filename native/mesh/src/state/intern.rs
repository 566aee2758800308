//! Shared copies of the strings many mesh records repeat. At 100k workloads the same few hundred namespaces,
//! service accounts, nodes, canonical names and revisions appear over and over; one shared allocation each, shared by every
//! record that names it, instead of a `String` per record (a workload record went from about 2.0 KB of heap to the
//! figure the `state_mem` example prints).
//!
//! Interned when a record is validated (outside the state's lock); `sweep` drops the strings no record holds any
//! more, after large batches.

use parking_lot::Mutex;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::OnceLock;
use triomphe::ThinArc;

/// A shared string: compares, hashes, orders and serializes as its text (so a `HashMap<Str, _>` is looked up by
/// `&str`), and clones by reference count.
///
/// One word: the length lives in the shared allocation (`triomphe::ThinArc`, whose header is the count and the
/// length, as large as `Arc<str>`'s two counts), not beside the pointer. A workload record names about twenty of
/// these, and every index key holds one or two: 8 bytes each at 100k workloads is ~20 MiB. Text is only ever put in
/// from a `&str`, so the bytes are always UTF-8.
#[derive(Clone)]
pub struct Str(ThinArc<(), u8>);

impl Str {
    pub fn as_str(&self) -> &str {
        // SAFETY: every Str is built from a &str (`From<&str>`, the only constructor), so the bytes are UTF-8.
        unsafe { std::str::from_utf8_unchecked(&self.0.slice) }
    }

    /// Whether `a` and `b` are one allocation.
    pub fn ptr_eq(a: &Str, b: &Str) -> bool {
        a.0.ptr() == b.0.ptr()
    }

    fn shared_elsewhere(&self) -> bool {
        ThinArc::strong_count(&self.0) > 1
    }
}

impl Default for Str {
    /// The empty string, one shared allocation.
    fn default() -> Str {
        static EMPTY: OnceLock<Str> = OnceLock::new();
        EMPTY.get_or_init(|| Str(ThinArc::from_header_and_slice((), &[]))).clone()
    }
}

impl PartialEq for Str {
    fn eq(&self, other: &Str) -> bool {
        Str::ptr_eq(self, other) || self.as_str() == other.as_str()
    }
}

impl Eq for Str {}

impl PartialOrd for Str {
    fn partial_cmp(&self, other: &Str) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Str {
    fn cmp(&self, other: &Str) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Str {
    /// As the text hashes: `Borrow<str>` lookups depend on it.
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Str {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Str {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Str {
    /// A new, unshared copy (for unique text such as a uid); `intern` shares.
    fn from(s: &str) -> Str {
        Str(ThinArc::from_header_and_slice((), s.as_bytes()))
    }
}

impl From<Str> for serde_json::Value {
    fn from(s: Str) -> serde_json::Value {
        serde_json::Value::String(s.to_string())
    }
}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Str {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Str {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Str> for String {
    fn eq(&self, other: &Str) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Str> for &str {
    fn eq(&self, other: &Str) -> bool {
        *self == other.as_str()
    }
}

impl fmt::Display for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl serde::Serialize for Str {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
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
        read_str(d, |s| Ok(intern(s)))
    }
}

/// A string read where the deserializer has it, without a copy of its own (serde's `Cow<str>` and `String` always
/// allocate one): `f` makes the value from it, or says what is wrong with it.
pub fn read_str<'de, D: serde::Deserializer<'de>, T>(
    d: D,
    f: impl FnOnce(&str) -> Result<T, String>,
) -> Result<T, D::Error> {
    struct Text<F>(F);
    impl<'de, T, F: FnOnce(&str) -> Result<T, String>> serde::de::Visitor<'de> for Text<F> {
        type Value = T;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<T, E> {
            (self.0)(v).map_err(E::custom)
        }
    }
    d.deserialize_str(Text(f))
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
    t.retain(Str::shared_elsewhere);
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

    #[test]
    fn one_word_and_looked_up_by_its_text() {
        assert_eq!(std::mem::size_of::<Str>(), 8);
        assert_eq!(std::mem::size_of::<Option<Str>>(), 8);
        let mut m = std::collections::HashMap::new();
        m.insert(Str::from("spiffe://cluster.local/ns/a/sa/b"), 1);
        m.insert(Str::default(), 2);
        assert_eq!(m.get("spiffe://cluster.local/ns/a/sa/b"), Some(&1));
        assert_eq!(m.get(""), Some(&2), "the empty text");
        assert_eq!(&*Str::default(), "");
        assert_eq!(Str::from("ü/ß").len(), 5, "bytes, as str counts them");
        let mut v = [Str::from("b"), Str::from("a"), Str::from("c")];
        v.sort();
        assert_eq!(v.iter().map(|s| s.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(Str::from("x"), Str::from("x"), "equal text, two allocations");
    }
}
