//! Packet bitmaps stored as 64-bit words (bit `i` of word `i / 64` is packet `i`).

/// A fixed-length set of packet numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u32,
    ones: u32,
}

impl Bitmap {
    /// An empty bitmap for `len` packets.
    pub fn new(len: u32) -> Self {
        Bitmap {
            words: vec![0; (len as usize).div_ceil(64)],
            len,
            ones: 0,
        }
    }

    /// A bitmap with all `len` packets set.
    pub fn full(len: u32) -> Self {
        let mut b = Bitmap::new(len);
        b.fill();
        b
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of set bits.
    pub fn count(&self) -> u32 {
        self.ones
    }

    pub fn is_full(&self) -> bool {
        self.ones == self.len
    }

    pub fn get(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1u64 << (i % 64)) != 0
    }

    /// Set bit `i`; returns true if it was clear. Out-of-range bits are ignored.
    pub fn set(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let m = 1u64 << (i % 64);
        if *w & m == 0 {
            *w |= m;
            self.ones += 1;
            true
        } else {
            false
        }
    }

    /// Clear bit `i`; returns true if it was set. Out-of-range bits are ignored.
    pub fn unset(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let w = &mut self.words[(i / 64) as usize];
        let m = 1u64 << (i % 64);
        if *w & m != 0 {
            *w &= !m;
            self.ones -= 1;
            true
        } else {
            false
        }
    }

    /// Clear every bit that is set in `other` (a bitmap of the same length).
    pub fn subtract(&mut self, other: &Bitmap) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        self.ones = self.words.iter().map(|w| w.count_ones()).sum();
    }

    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
        self.ones = 0;
    }

    pub fn fill(&mut self) {
        self.words.iter_mut().for_each(|w| *w = u64::MAX);
        let tail = self.len % 64;
        if tail != 0 {
            if let Some(last) = self.words.last_mut() {
                *last = (1u64 << tail) - 1;
            }
        }
        self.ones = self.len;
    }

    /// OR in a wire bitmap (LSB-first bytes). Bits beyond `len` are ignored.
    pub fn union_bytes(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            if *b == 0 {
                continue;
            }
            for bit in 0..8 {
                if b & (1 << bit) != 0 {
                    self.set((i * 8 + bit) as u32);
                }
            }
        }
    }

    /// Append the wire form (LSB-first bytes, `ceil(len / 8)` of them).
    pub fn write_bytes(&self, out: &mut Vec<u8>) {
        let n = (self.len as usize).div_ceil(8);
        for i in 0..n {
            out.push((self.words[i / 8] >> ((i % 8) * 8)) as u8);
        }
    }

    /// First `i >= from` set in `self`, clear in `a` and clear in `b`.
    pub fn next_in_not(&self, a: &Bitmap, b: &Bitmap, from: u32) -> Option<u32> {
        if from >= self.len {
            return None;
        }
        let start = (from / 64) as usize;
        for wi in start..self.words.len() {
            let mut w = self.words[wi] & !word(a, wi) & !word(b, wi);
            if wi == start {
                w &= u64::MAX << (from % 64);
            }
            if w != 0 {
                let i = wi as u32 * 64 + w.trailing_zeros();
                return (i < self.len).then_some(i);
            }
        }
        None
    }

    /// The bits set in `self` and clear in `a`, in order (a word at a time).
    pub fn ones_not<'a>(&'a self, a: &'a Bitmap) -> impl Iterator<Item = u32> + 'a {
        self.words
            .iter()
            .enumerate()
            .flat_map(move |(wi, w)| {
                let mut w = w & !word(a, wi);
                std::iter::from_fn(move || {
                    (w != 0).then(|| {
                        let i = w.trailing_zeros();
                        w &= w - 1;
                        wi as u32 * 64 + i
                    })
                })
            })
            .take_while(|&i| i < self.len)
    }

    /// Number of bits set in `self` and clear in both `a` and `b`.
    pub fn count_in_not(&self, a: &Bitmap, b: &Bitmap) -> u32 {
        self.words
            .iter()
            .enumerate()
            .map(|(wi, w)| (w & !word(a, wi) & !word(b, wi)).count_ones())
            .sum()
    }
}

fn word(b: &Bitmap, i: usize) -> u64 {
    b.words.get(i).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_and_tail() {
        let b = Bitmap::full(70);
        assert_eq!(b.count(), 70);
        assert!(b.get(69));
        assert!(!b.get(70));
        let mut out = Vec::new();
        b.write_bytes(&mut out);
        assert_eq!(out.len(), 9);
        assert_eq!(out[8], 0x3f);
    }

    proptest! {
        #[test]
        fn bytes_round_trip(bits in proptest::collection::vec(any::<bool>(), 0..300)) {
            let mut b = Bitmap::new(bits.len() as u32);
            for (i, x) in bits.iter().enumerate() {
                if *x { b.set(i as u32); }
            }
            let mut out = Vec::new();
            b.write_bytes(&mut out);
            let mut c = Bitmap::new(bits.len() as u32);
            c.union_bytes(&out);
            prop_assert_eq!(&b, &c);
            let none = Bitmap::new(bits.len() as u32);
            let mut found = Vec::new();
            let mut from = 0;
            while let Some(i) = b.next_in_not(&none, &none, from) {
                found.push(i);
                from = i + 1;
            }
            let want: Vec<u32> = bits.iter().enumerate().filter(|(_, x)| **x).map(|(i, _)| i as u32).collect();
            prop_assert_eq!(found, want);
            prop_assert_eq!(b.count_in_not(&none, &none), b.count());
        }

        #[test]
        fn ones_not_is_set_here_and_clear_there(
            bits in proptest::collection::vec(any::<(bool, bool)>(), 0..300),
        ) {
            let n = bits.len() as u32;
            let (mut a, mut b) = (Bitmap::new(n), Bitmap::new(n));
            for (i, (x, y)) in bits.iter().enumerate() {
                if *x { a.set(i as u32); }
                if *y { b.set(i as u32); }
            }
            let want: Vec<u32> = (0..n).filter(|&i| a.get(i) && !b.get(i)).collect();
            prop_assert_eq!(a.ones_not(&b).collect::<Vec<_>>(), want);
            prop_assert_eq!(Bitmap::full(n).ones_not(&Bitmap::new(0)).count() as u32, n);
        }
    }
}
