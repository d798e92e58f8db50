//! The binomial pipeline (`topology = "binomial"`): who sends which chunk to whom when every
//! receiver also sends, so that a transfer to `N` receivers fills in about `log2 N` chunk
//! steps instead of a chain's `N`.
//!
//! # The schedule
//!
//! The `p` nodes get ranks: the source is 0, the sinks follow in file order. The first
//! `q = 2^d` ranks (`q` the largest power of two not above `p`) are the vertices of a
//! `d`-dimensional hypercube; each further rank `q + i` is the *twin* of vertex `q − 1 − i`
//! (never of the source's vertex 0), and the two share that vertex's work.
//!
//! Chunk `seq` travels down spanning tree `j = seq mod d` of the cube, one of `d`
//! edge-disjoint spanning binomial trees (Johnsson and Ho, "Optimum broadcasting and
//! personalized communication in hypercubes", IEEE Trans. Computers 38(9), 1989): the source
//! sends it once, across dimension `j`, to vertex `s = 2^j`; from `s` it spreads as a binomial
//! tree whose dimensions are taken in the rotated order `j+1, j+2, …, j+d` (mod `d`): a vertex
//! `x` (address relative to `s`: `c = x ⊕ s`) gets the chunk from `c` with its last set bit in
//! that order cleared. So the source sends every chunk exactly once, every other vertex
//! receives it exactly once, and over any `d` consecutive chunks each directed cube link
//! carries at most one: every node sends and receives about one chunk per chunk step, the
//! pipelined bound of Bar-Noy and Kipnis (`k + log2 p − 1` steps for `k` chunks) up to a
//! constant.
//!
//! In a vertex with a twin, the chunk goes to one member (the *receiver*, alternating with
//! `seq`'s parity), which passes it to the other (the *sender*), which forwards it down the
//! tree: each member then sends about one chunk per step, like every other node.
//!
//! The α–β cost for `S` bytes in chunks of `c` to `N = p − 1` receivers over links of
//! bandwidth `B` and per-chunk latency `α`: about `(S/c + d + 1 + t)·(α + c/B)` (a chunk
//! crosses at most `d + 1` links, plus one per vertex with a twin on its way, `t ≤ d + 1`), against a chain's `(S/c + N − 1)·(α + c/B)` and a tree of fan-out `f` and
//! depth `L`: `(f·S/c + L)·(α + c/B)` (an interior node sends every chunk `f` times).

/// The binomial pipeline over `p` ranks (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binomial {
    p: usize,
    q: usize,
    d: u32,
}

impl Binomial {
    /// The schedule for `p` ranks (rank 0 the source); `None` for fewer than two.
    pub fn new(p: usize) -> Option<Binomial> {
        if p < 2 {
            return None;
        }
        let d = usize::BITS - 1 - p.leading_zeros();
        Some(Binomial { p, q: 1 << d, d })
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.p
    }

    /// The cube's dimension `d`: a chunk crosses at most `d + 1` links, plus one for every
    /// vertex with a twin on its way.
    pub fn dimension(&self) -> u32 {
        self.d
    }

    /// The members of cube vertex `v`: itself, and its twin if it has one.
    fn members(&self, v: usize) -> (usize, Option<usize>) {
        let twin = self.q + (self.q - 1 - v);
        (v, (v != 0 && twin < self.p).then_some(twin))
    }

    /// The vertex of rank `r`.
    fn vertex(&self, r: usize) -> usize {
        if r < self.q {
            r
        } else {
            self.q - 1 - (r - self.q)
        }
    }

    /// In vertex `v`, who receives chunk `seq` from the cube, and who forwards it on.
    fn roles(&self, v: usize, seq: u64) -> (usize, usize) {
        match self.members(v) {
            (a, Some(b)) if seq % 2 == 1 => (b, a),
            (a, Some(b)) => (a, b),
            (a, None) => (a, a),
        }
    }

    /// The cube parent of vertex `x` (not 0) in tree `j`.
    fn cube_parent(&self, x: usize, j: u32) -> usize {
        let s = 1usize << j;
        let c = x ^ s;
        if c == 0 {
            return 0;
        }
        // The last set bit of `c` in the order j+1, j+2, ..., j+d (mod d).
        let last = (0..self.d)
            .rev()
            .map(|i| (j + 1 + i) % self.d)
            .find(|&o| c & (1 << o) != 0)
            .unwrap_or(j);
        (c ^ (1 << last)) ^ s
    }

    /// Who sends chunk `seq` to rank `r` (`None` for the source).
    pub fn parent(&self, r: usize, seq: u64) -> Option<usize> {
        if r == 0 || r >= self.p {
            return None;
        }
        let v = self.vertex(r);
        let (recv, _) = self.roles(v, seq);
        if r != recv {
            return Some(recv); // the twin that received it passes it on
        }
        let j = (seq % u64::from(self.d)) as u32;
        Some(self.roles(self.cube_parent(v, j), seq).1)
    }

    /// Whom rank `r` sends chunk `seq` to, once it has it: the child with the most ranks
    /// below it first (a node sends one chunk at a time, and the deepest branch has the
    /// longest way to go).
    pub fn children(&self, r: usize, seq: u64) -> Vec<usize> {
        let mut kids: Vec<usize> = (1..self.p)
            .filter(|&x| self.parent(x, seq) == Some(r))
            .collect();
        kids.sort_by_key(|&k| std::cmp::Reverse(self.below(k, seq)));
        kids
    }

    /// How many ranks get chunk `seq` through rank `r` (itself excluded).
    fn below(&self, r: usize, seq: u64) -> usize {
        (1..self.p)
            .filter(|&x| {
                let mut cur = x;
                for _ in 0..self.p {
                    match self.parent(cur, seq) {
                        Some(p) if p == r => return true,
                        Some(p) if p != 0 => cur = p,
                        _ => return false,
                    }
                }
                false
            })
            .count()
    }

    /// Chunks after which the schedule repeats (the trees and the twins' turns).
    pub fn period(&self) -> u64 {
        2 * u64::from(self.d)
    }

    /// Every rank `r` exchanges chunks with, in either direction, ascending.
    pub fn partners(&self, r: usize) -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for seq in 0..self.period() {
            if let Some(p) = self.parent(r, seq) {
                out.push(p);
            }
            out.extend(self.children(r, seq));
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays `chunks` chunks: every rank but the source receives each exactly once, from a
    /// rank that has it by then, and the steps to deliver chunk k are bounded.
    fn check(p: usize, chunks: u64) -> Vec<u64> {
        let b = Binomial::new(p).unwrap();
        let mut sends = vec![0u64; p];
        for seq in 0..chunks {
            // Breadth-first from the source, counting the hops.
            let mut depth = vec![None; p];
            depth[0] = Some(0u32);
            let mut frontier = vec![0usize];
            while let Some(x) = frontier.pop() {
                for c in b.children(x, seq) {
                    assert!(depth[c].is_none(), "p={p} seq={seq}: {c} receives twice");
                    assert_eq!(b.parent(c, seq), Some(x));
                    depth[c] = Some(depth[x].unwrap() + 1);
                    sends[x] += 1;
                    frontier.push(c);
                }
            }
            for (r, d) in depth.iter().enumerate() {
                let d = d.unwrap_or_else(|| panic!("p={p} seq={seq}: rank {r} never gets it"));
                // One more link for every vertex with a twin on the way.
                let twins = (p - b.q).min(b.d as usize + 1) as u32;
                assert!(
                    d <= b.d + 1 + twins,
                    "p={p} seq={seq}: rank {r} at depth {d}"
                );
            }
            // The source sends every chunk once.
            assert_eq!(b.children(0, seq).len(), 1, "p={p} seq={seq}");
        }
        sends
    }

    #[test]
    fn every_rank_gets_every_chunk_once_and_the_work_is_shared() {
        for p in 2..=40 {
            let d = u64::from(Binomial::new(p).unwrap().d);
            let chunks = 4 * d * 2;
            let sends = check(p, chunks);
            let max = *sends.iter().max().unwrap();
            // Nobody sends much more than one chunk per chunk step.
            assert!(
                max as f64 <= 1.5 * chunks as f64 + 1.0,
                "p={p}: sends per rank {sends:?} over {chunks} chunks"
            );
        }
    }

    #[test]
    fn a_cube_uses_each_link_once_per_round() {
        for d in 1..=5u32 {
            let p = 1usize << d;
            let b = Binomial::new(p).unwrap();
            let mut used = std::collections::BTreeSet::new();
            for seq in 0..u64::from(d) {
                for x in 0..p {
                    for c in b.children(x, seq) {
                        assert!(used.insert((x, c)), "p={p}: link {x}->{c} used twice");
                    }
                }
            }
            // Every rank sends at most one chunk per chunk step.
            let sends = check(p, u64::from(d) * 6);
            assert!(sends.iter().all(|&s| s <= u64::from(d) * 6), "{sends:?}");
        }
    }

    #[test]
    fn partners_are_symmetric_and_few() {
        for p in 2..=33 {
            let b = Binomial::new(p).unwrap();
            for r in 0..p {
                let ps = b.partners(r);
                assert!(!ps.contains(&r));
                for &o in &ps {
                    assert!(b.partners(o).contains(&r), "p={p}: {r} - {o}");
                }
                assert!(ps.len() <= 2 * b.d as usize + 1, "p={p} r={r}: {ps:?}");
            }
        }
        assert_eq!(Binomial::new(1), None);
        assert_eq!(Binomial::new(2).unwrap().partners(0), [1]);
    }
}
