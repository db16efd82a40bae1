//! Word to id lookup for corpus streaming: an open-addressing table whose slots hold short
//! words inline, so that looking a token up reads one cache line where a `HashMap<String, u32>`
//! reads three (the control bytes, the bucket, and the key's heap string). Every token of every
//! epoch is looked up, and at a vocabulary of 10^5 to 10^6 words each of those reads is a
//! cache miss (docs/decisions.md, "word-ids-inline").
//!
//! Slots are 32 bytes: a 32-bit hash tag, the id, the length and up to [`INLINE`] bytes of the
//! word; longer words keep their bytes in one shared buffer and the slot its offset. The table
//! is at most half full and probed linearly, so a lookup usually ends in its first slot.

use std::fmt;
use std::hash::Hasher;

/// Longest word kept inside its slot.
const INLINE: usize = 20;
/// Id of an empty slot.
const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(32))]
struct Slot {
    tag: u32,
    id: u32,
    len: u32,
    /// The word (`len <= INLINE`), or the little-endian offset of its bytes in `long`.
    bytes: [u8; INLINE],
}

const VACANT: Slot = Slot { tag: 0, id: EMPTY, len: 0, bytes: [0; INLINE] };

/// Ids of distinct words, looked up by their text.
#[derive(Clone, PartialEq, Eq)]
pub struct WordIds {
    slots: Vec<Slot>,
    /// Bytes of the words longer than [`INLINE`].
    long: Vec<u8>,
    len: usize,
    /// `64 - log2(slots.len())`: a hash's top bits are its home slot.
    shift: u32,
}

impl Default for WordIds {
    fn default() -> Self {
        Self { slots: vec![VACANT], long: Vec::new(), len: 0, shift: 64 }
    }
}

impl fmt::Debug for WordIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WordIds").field("words", &self.len).field("slots", &self.slots.len()).finish()
    }
}

/// 64 well-mixed bits of `word`: FxHash of its bytes, then a multiplication so that the top
/// bits (the home slot) depend on all of them.
#[inline]
fn hash(word: &[u8]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    h.write(word);
    h.finish().wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl WordIds {
    /// Word `i` of `words` gets id `i`. A word given twice keeps its first id, so that
    /// [`len`](Self::len) is then below `words.len()` (callers that need distinct words check
    /// it); so are words beyond the ids a `u32` holds.
    pub fn new<S: AsRef<str>>(words: &[S]) -> Self {
        let n = words.len().min(EMPTY as usize);
        let bits = (2 * n).next_power_of_two().max(2).trailing_zeros();
        // Probed at random for every token read: in huge pages at large sizes.
        let mut slots = farout_core::hugepages::with_capacity(1 << bits);
        slots.resize(1 << bits, VACANT);
        let mut t = Self { slots, long: Vec::new(), len: 0, shift: 64 - bits };
        for (id, w) in words[..n].iter().enumerate() {
            t.insert(w.as_ref(), id as u32);
        }
        t
    }

    /// The first word of `words` that is there twice.
    pub fn first_repeat<S: AsRef<str>>(words: &[S]) -> Option<&str> {
        let mut seen = rustc_hash::FxHashSet::default();
        words.iter().map(AsRef::as_ref).find(|w| !seen.insert(*w))
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no words.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Id of `word`.
    #[inline]
    pub fn get(&self, word: &str) -> Option<u32> {
        let w = word.as_bytes();
        self.probe(w, hash(w)).ok()
    }

    /// The id of the word `w` of hash `h`, or the empty slot where its probe ended.
    #[inline(always)]
    fn probe(&self, w: &[u8], h: u64) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let mut i = (h >> self.shift) as usize & mask;
        loop {
            let s = &self.slots[i];
            if s.id == EMPTY {
                return Err(i);
            }
            if s.tag == h as u32 && s.len as usize == w.len() && self.key(s) == w {
                return Ok(s.id);
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `word` with `id`; false when it is there already.
    fn insert(&mut self, word: &str, id: u32) -> bool {
        let (w, h) = (word.as_bytes(), hash(word.as_bytes()));
        let Err(at) = self.probe(w, h) else { return false };
        let mut slot = Slot { tag: h as u32, id, len: w.len() as u32, bytes: [0; INLINE] };
        if w.len() <= INLINE {
            slot.bytes[..w.len()].copy_from_slice(w);
        } else {
            slot.bytes[..8].copy_from_slice(&(self.long.len() as u64).to_le_bytes());
            self.long.extend_from_slice(w);
        }
        self.slots[at] = slot;
        self.len += 1;
        true
    }

    /// The bytes of the word in slot `s`.
    #[inline]
    fn key<'a>(&'a self, s: &'a Slot) -> &'a [u8] {
        let len = s.len as usize;
        if len <= INLINE {
            &s.bytes[..len]
        } else {
            let at = u64::from_le_bytes(s.bytes[..8].try_into().expect("8 bytes")) as usize;
            &self.long[at..at + len]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Every word is found with its id, and words not given (including prefixes, extensions
    /// and words of the same hash tag's length) are not, as a `HashMap` says.
    #[test]
    fn lookups_agree_with_a_hash_map() {
        let mut words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
        words.push(String::new());
        words.push("a-word-much-longer-than-twenty-bytes".into());
        words.push("a-word-much-longer-than-twenty-bytez".into());
        words.push("exactly-twenty-bytes".into());
        words.push("ünïcödé".into());
        let ids = WordIds::new(&words);
        let reference: HashMap<&str, u32> = words.iter().enumerate().map(|(i, w)| (w.as_str(), i as u32)).collect();
        assert_eq!(ids.len(), words.len());
        let probes = words.iter().cloned().chain((0..20_000).map(|i| format!("w{i}"))).chain(
            [
                "a-word-much-longer-than-twenty-byte",
                "a-word-much-longer-than-twenty-bytesx",
                "exactly-twenty-byte",
                "ü",
            ]
            .map(String::from),
        );
        for p in probes {
            assert_eq!(ids.get(&p), reference.get(p.as_str()).copied(), "{p:?}");
        }
    }

    #[test]
    fn a_repeated_word_keeps_its_first_id() {
        let ids = WordIds::new(&["a", "b", "a"]);
        assert_eq!((ids.len(), ids.get("a"), ids.get("b")), (2, Some(0), Some(1)));
        assert_eq!(WordIds::first_repeat(&["a", "b", "b", "a"]), Some("b"));
        assert_eq!(WordIds::first_repeat(&["a", "b"]), None);
        let empty = WordIds::new::<&str>(&[]);
        assert!(empty.is_empty() && empty.get("a").is_none());
        assert!(WordIds::default().get("").is_none());
    }
}
