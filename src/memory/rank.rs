//! Ranking (pure): vector similarity over a [`VectorSet`], and the fusion of ranked lists:
//! reciprocal-rank fusion (each item optionally scaled by a factor of its own) and a convex
//! combination of min-max normalised scores.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::store::memory::VectorSet;

/// The usual RRF constant (Cormack et al. 2009): dampens the weight of the very first ranks.
pub const RRF_K: f64 = 60.0;

/// Scale `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Dot product with eight independent accumulators, so the compiler can use SIMD lanes (a
/// plain `sum()` of floats must run in order). The hot loop of hybrid search.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (ca, ra) = a.as_chunks::<8>();
    let (cb, rb) = b.as_chunks::<8>();
    let mut acc = [0f32; 8];
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

/// A candidate in the bounded heap: ordered so that the heap's top is the *worst* kept one.
struct Scored(f32, i64);

impl PartialEq for Scored {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scored {}
impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reverse on the score (a min-heap of scores); ties: the higher id is worse.
        other
            .0
            .total_cmp(&self.0)
            .then_with(|| self.1.cmp(&other.1))
    }
}

/// The `k` rows of `set` most similar to `query` (dot product; both sides are unit vectors, so
/// it is the cosine), best first. A query of another size matches nothing.
pub fn top_k(set: &VectorSet, query: &[f32], k: usize) -> Vec<(i64, f32)> {
    if k == 0 || query.len() != set.dims {
        return Vec::new();
    }
    let mut heap = BinaryHeap::with_capacity(k + 1);
    for (i, &id) in set.ids.iter().enumerate() {
        let s = dot(set.row(i), query);
        if heap.len() < k {
            heap.push(Scored(s, id));
        } else if let Some(worst) = heap.peek()
            && Scored(s, id) < *worst
        {
            heap.pop();
            heap.push(Scored(s, id));
        }
    }
    let mut out: Vec<(i64, f32)> = heap.into_iter().map(|Scored(s, id)| (id, s)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out
}

/// Weighted reciprocal-rank fusion: an item at rank `r` (from 1) of a list with weight `w`
/// gets `w / (RRF_K + r)`; the sums are sorted best first, ties by first appearance across
/// the lists.
pub fn rrf(lists: &[(&[i64], f64)]) -> Vec<(i64, f64)> {
    let scaled: Vec<(Vec<(i64, f64)>, f64)> = lists
        .iter()
        .map(|(list, w)| (list.iter().map(|&id| (id, 1.0)).collect(), *w))
        .collect();
    let refs: Vec<(&[(i64, f64)], f64)> = scaled.iter().map(|(l, w)| (l.as_slice(), *w)).collect();
    rrf_scaled(&refs)
}

/// [`rrf`] where each item carries a factor of its own (0–1, e.g. how much of the query a
/// full-text hit contains): an item at rank `r` with factor `f` in a list of weight `w` gets
/// `w * f / (RRF_K + r)`. The ranks are the lists' own.
pub fn rrf_scaled(lists: &[(&[(i64, f64)], f64)]) -> Vec<(i64, f64)> {
    sum_sorted(lists.iter().map(|(list, weight)| {
        list.iter()
            .enumerate()
            .map(move |(rank, &(id, f))| (id, weight * f / (RRF_K + rank as f64 + 1.0)))
    }))
}

/// Convex combination of scores (higher is better in every list): each list is [`min_max`]
/// normalised, then [`weighted_sum`]med.
pub fn convex(lists: &[(&[(i64, f64)], f64)]) -> Vec<(i64, f64)> {
    let normed: Vec<(Vec<(i64, f64)>, f64)> = lists.iter().map(|(l, w)| (min_max(l), *w)).collect();
    let refs: Vec<(&[(i64, f64)], f64)> = normed.iter().map(|(l, w)| (l.as_slice(), *w)).collect();
    weighted_sum(&refs)
}

/// Scores (higher is better) scaled to 0–1 over the list's own items: the best gets 1, the
/// worst 0; all get 1 when they are equal. Order kept.
pub fn min_max(list: &[(i64, f64)]) -> Vec<(i64, f64)> {
    let (lo, hi) = list
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &(_, s)| {
            (lo.min(s), hi.max(s))
        });
    let span = hi - lo;
    list.iter()
        .map(|&(id, s)| (id, if span > 0.0 { (s - lo) / span } else { 1.0 }))
        .collect()
}

/// Each item's scores times its list's weight, summed (an item absent from a list gets 0 from
/// it); best first, ties by first appearance across the lists.
pub fn weighted_sum(lists: &[(&[(i64, f64)], f64)]) -> Vec<(i64, f64)> {
    sum_sorted(
        lists
            .iter()
            .map(|(list, weight)| list.iter().map(move |&(id, s)| (id, weight * s))),
    )
}

/// Sum the contributions per id; best first, ties by first appearance.
fn sum_sorted<I, L>(lists: I) -> Vec<(i64, f64)>
where
    I: Iterator<Item = L>,
    L: Iterator<Item = (i64, f64)>,
{
    let mut scores: HashMap<i64, (f64, usize)> = HashMap::new();
    let mut order = 0;
    for list in lists {
        for (id, add) in list {
            let e = scores.entry(id).or_insert_with(|| {
                order += 1;
                (0.0, order)
            });
            e.0 += add;
        }
    }
    let mut out: Vec<(i64, f64, usize)> =
        scores.into_iter().map(|(id, (s, o))| (id, s, o)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    out.into_iter().map(|(id, s, _)| (id, s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(rows: &[(i64, [f32; 2])]) -> VectorSet {
        VectorSet {
            generation: 0,
            dims: 2,
            ids: rows.iter().map(|r| r.0).collect(),
            data: rows.iter().flat_map(|r| r.1).collect(),
        }
    }

    #[test]
    fn top_k_orders_by_cosine() {
        let s = set(&[
            (1, [1.0, 0.0]),
            (2, [0.0, 1.0]),
            (3, [0.6, 0.8]),
            (4, [-1.0, 0.0]),
        ]);
        let hits = top_k(&s, &[1.0, 0.0], 2);
        assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!(top_k(&s, &[1.0, 0.0, 0.0], 2).is_empty(), "other dimension");
        assert_eq!(top_k(&s, &[0.0, 1.0], 10).len(), 4);
    }

    #[test]
    fn rrf_rewards_agreement() {
        // 7 is second in both lists, 1 and 9 first in one each and absent from the other.
        let fused = rrf(&[(&[1, 7, 3], 1.0), (&[9, 7, 3], 1.0)]);
        assert_eq!(fused[0].0, 7);
        assert_eq!(fused.len(), 4);
        assert!(fused.windows(2).all(|w| w[0].1 >= w[1].1));
        assert_eq!(rrf(&[]), vec![]);
        // A heavier list wins a tie of ranks.
        let fused = rrf(&[(&[1], 0.5), (&[2], 1.0)]);
        assert_eq!(fused[0].0, 2);
    }

    #[test]
    fn scaled_rrf_weighs_each_item() {
        // A full-text hit that holds a third of the query counts a third of a rank.
        let fused = rrf_scaled(&[(&[(1, 1.0 / 3.0), (2, 1.0)], 1.0), (&[(3, 1.0)], 1.0)]);
        assert_eq!(fused.iter().map(|f| f.0).collect::<Vec<_>>(), vec![3, 2, 1]);
        // Factors of 1 are plain RRF.
        assert_eq!(
            rrf_scaled(&[(&[(1, 1.0), (7, 1.0)], 1.0), (&[(7, 1.0)], 0.5)]),
            rrf(&[(&[1, 7], 1.0), (&[7], 0.5)])
        );
    }

    #[test]
    fn convex_normalises_each_list() {
        // bm25-like scores far apart and cosines close together weigh the same after min-max.
        let fts = [(1, 30.0), (2, 10.0), (3, 0.0)];
        let vec = [(3, 0.61), (4, 0.60), (1, 0.31)];
        let fused = convex(&[(&fts, 1.0), (&vec, 1.0)]);
        assert_eq!(fused[0], (1, 1.0));
        assert_eq!(fused[1].0, 3);
        assert!((fused[1].1 - 1.0).abs() < 1e-9);
        assert_eq!(fused[2].0, 4);
        assert!((fused[2].1 - 29.0 / 30.0).abs() < 1e-9);
        // One item, or all equal: each counts fully.
        assert_eq!(convex(&[(&[(5, 0.2)], 0.5)]), vec![(5, 0.5)]);
        assert!(convex(&[]).is_empty());
    }

    #[test]
    fn dot_matches_the_plain_sum() {
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 - i as f32 * 0.1).collect();
        let plain: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!(
            (dot(&a, &b) - plain).abs() < 1e-4,
            "{} vs {plain}",
            dot(&a, &b)
        );
        assert_eq!(dot(&[], &[]), 0.0);
    }

    #[test]
    fn normalize_gives_unit_length() {
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut z = vec![0.0, 0.0];
        normalize(&mut z);
        assert_eq!(z, vec![0.0, 0.0]);
    }

    proptest! {
        /// The bounded heap gives the same answer as sorting everything.
        #[test]
        fn top_k_matches_a_full_sort(
            rows in proptest::collection::vec((-1.0f32..1.0, -1.0f32..1.0), 0..60),
            q in (-1.0f32..1.0, -1.0f32..1.0),
            k in 0usize..10,
        ) {
            let s = VectorSet {
                generation: 0,
                dims: 2,
                ids: (0..rows.len() as i64).collect(),
                data: rows.iter().flat_map(|r| [r.0, r.1]).collect(),
            };
            let q = [q.0, q.1];
            let mut all: Vec<(i64, f32)> = (0..rows.len())
                .map(|i| (i as i64, dot(s.row(i), &q)))
                .collect();
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            all.truncate(k);
            prop_assert_eq!(top_k(&s, &q, k), all);
        }
    }
}
