//! The set of slots a search may return: one bit per slot of a generation.
//!
//! This is what a session holds, so its size is the point: `n / 8` bytes plus a small header.

use super::Slot;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowList {
    words: Box<[u64]>,
    len: usize,
    count: usize,
}

impl AllowList {
    /// No slot allowed, over a generation of `len` slots.
    pub fn none(len: usize) -> Self {
        Self { words: vec![0; len.div_ceil(64)].into_boxed_slice(), len, count: 0 }
    }

    /// Every slot allowed.
    pub fn all(len: usize) -> Self {
        let mut a = Self::none(len);
        for s in 0..len {
            a.insert(s as Slot);
        }
        a
    }

    pub fn from_slots(len: usize, slots: impl IntoIterator<Item = Slot>) -> Self {
        let mut a = Self::none(len);
        for s in slots {
            a.insert(s);
        }
        a
    }

    pub fn insert(&mut self, slot: Slot) {
        let (w, b) = (slot as usize / 64, slot as usize % 64);
        assert!((slot as usize) < self.len, "slot {slot} outside a generation of {}", self.len);
        if self.words[w] & (1 << b) == 0 {
            self.words[w] |= 1 << b;
            self.count += 1;
        }
    }

    #[inline]
    pub fn contains(&self, slot: Slot) -> bool {
        let (w, b) = (slot as usize / 64, slot as usize % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Number of allowed slots.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Size of the generation this list is for.
    pub fn universe(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                Some((w * 64) as Slot + b)
            })
        })
    }

    /// Adds every slot of `other` (a list over the same generation).
    pub fn union_with(&mut self, other: &AllowList) {
        assert_eq!(self.len, other.len, "allow-lists of different generations");
        for (w, o) in self.words.iter_mut().zip(other.words.iter()) {
            *w |= o;
        }
        self.count = self.words.iter().map(|w| w.count_ones() as usize).sum();
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.words.len() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_contains_iter_count() {
        let mut a = AllowList::none(130);
        for s in [0, 63, 64, 129, 64] {
            a.insert(s);
        }
        assert_eq!(a.count(), 4);
        assert!(a.contains(63) && a.contains(129) && !a.contains(1) && !a.contains(500));
        assert_eq!(a.iter().collect::<Vec<_>>(), vec![0, 63, 64, 129]);
        assert_eq!(AllowList::all(70).count(), 70);
        assert_eq!(AllowList::none(0).iter().count(), 0);
        assert_eq!(AllowList::none(1000).heap_bytes(), 128);
    }
}
