//! The query adapter: one `dim × dim` matrix `W` that find_tool applies to a request's vector
//! before the dense search (`q' = normalise(W·q)`), learned from this deployment's labels
//! (request vector, tool then called). Where the per-tool bonus ([`super::learned`]) moves tools
//! that past requests like this one led to, `W` moves the request itself towards the way this
//! deployment's users speak, so it also helps requests for tools it has few labels of.
//!
//! Fitting: `W` starts at the identity and minimises a softmax cross-entropy over cosine scores
//! (temperature [`Settings::temperature`]): each label's tool against every other tool of the
//! catalog (or, past [`FULL_SOFTMAX`] tools, against the batch's tools, each request's hardest
//! tools by the plain cosine and a random sample), with Adam and a decay that pulls `W` back
//! towards the identity. Single-threaded, in batches, so it never takes more than one core.
//!
//! The guard: a slice of the requests (by request, never splitting one's labels) is held back;
//! `W` is served only if it lifts recall@8 of the held-back labels over the plain cosine by
//! [`MARGIN`] points, otherwise the identity is kept (nothing changes).

use rand::SeedableRng;
use rand::seq::SliceRandom;

/// Past this many tools a batch's softmax runs over sampled tools instead of the whole catalog.
pub const FULL_SOFTMAX: usize = 4096;
/// Labels the adapter needs (from tools that count) before it is fitted at all.
pub const MIN_LABELS: usize = 40;
/// Points of recall@8 on the held-back labels by which `W` must beat the identity to be served.
pub const MARGIN: f64 = 1.0;
/// The share of requests held back to judge a fit.
pub const HELD_OUT: f64 = 0.2;
/// What the dense arm takes back from the cosine of each tool whose labels teach `W`, while `W`
/// is served. `W` learns that those tools are the usual answer and pulls every request towards
/// them, also requests for tools no label taught it. That prior is about the same for every
/// request, so a constant takes most of it back and leaves what `W` learned of the request
/// (calibrated stacking, as in generalised zero-shot classification). Chosen on metatool's
/// replay over four fold keys (docs/search.md).
pub const OFFSET: f32 = 0.05;
/// Depth at which the guard measures recall.
const GUARD_DEPTH: usize = 8;
/// Hardest tools kept per request when the softmax samples.
const HARD: usize = 16;
/// Random tools added to each sampled batch.
const RANDOM: usize = 512;

/// How a fit runs: chosen with `toolmux eval-learning` on metatool's replay, the one set whose
/// tools repeat enough to fit at all (docs/search.md says what each setting gave).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub temperature: f32,
    pub learning_rate: f32,
    /// Decoupled decay towards the identity, per step, as a share of the learning rate.
    pub decay: f32,
    pub epochs: usize,
    pub batch: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self { temperature: 0.05, learning_rate: 5e-4, decay: 0.1, epochs: 20, batch: 128 }
    }
}

/// One label as the fit sees it: a unit request vector, the row of its tool in the catalog,
/// its weight, and which request it came from (labels of one request stay on one side of the
/// held-out split).
#[derive(Debug, Clone)]
pub struct Example {
    pub query: Vec<f32>,
    pub target: usize,
    pub weight: f32,
    pub request: u64,
    /// Whether it may teach and judge `W` (its tool was labelled by enough principals); one
    /// that may not is skipped.
    pub teaches: bool,
}

/// A fitted `W`, row-major: `q'[r] = Σ_c w[r·dim + c]·q[c]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    pub dim: usize,
    pub w: Vec<f32>,
}

impl Adapter {
    pub fn identity(dim: usize) -> Self {
        let mut w = vec![0.0; dim * dim];
        (0..dim).for_each(|i| w[i * dim + i] = 1.0);
        Self { dim, w }
    }

    /// `normalise(W·q)`; `q` itself if the product is zero or `q` is of another dimension.
    pub fn apply(&self, q: &[f32]) -> Vec<f32> {
        if q.len() != self.dim {
            return q.to_vec();
        }
        let mut out: Vec<f32> = self.w.chunks_exact(self.dim).map(|row| dot(row, q)).collect();
        let norm = dot(&out, &out).sqrt();
        if !(norm.is_finite() && norm > 0.0) {
            return q.to_vec();
        }
        out.iter_mut().for_each(|x| *x /= norm);
        out
    }

    pub fn is_finite(&self) -> bool {
        self.w.len() == self.dim * self.dim && self.w.iter().all(|x| x.is_finite())
    }

    /// How far from the identity (Frobenius norm of `W − I`).
    pub fn distance(&self) -> f32 {
        let mut sum = 0.0;
        for (i, x) in self.w.iter().enumerate() {
            let id = if i / self.dim == i % self.dim { 1.0 } else { 0.0 };
            sum += (x - id) * (x - id);
        }
        sum.sqrt()
    }
}

use crate::simd::dot;

/// `out (m×n) = a (m×k) · b (k×n)`, all row-major; `ta`/`tb` say `a`/`b` are stored transposed
/// (`k×m`, `n×k`). One thread: a fit runs beside the gateway's own work.
#[allow(clippy::too_many_arguments)]
fn matmul(out: &mut [f32], a: &[f32], ta: bool, b: &[f32], tb: bool, m: usize, k: usize, n: usize) {
    assert!(out.len() >= m * n && a.len() >= m * k && b.len() >= k * n, "matmul shapes");
    let (a_cs, a_rs) = if ta { (m as isize, 1) } else { (1, k as isize) };
    let (b_cs, b_rs) = if tb { (k as isize, 1) } else { (1, n as isize) };
    // SAFETY: the asserts above keep every element gemm reads or writes inside its slice, for
    // the strides chosen (a row-major matrix or its transpose).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// How a fit went and whether its `W` is served.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Judged {
    /// Labels fitted on and held back.
    pub fitted: usize,
    pub held_out: usize,
    /// Recall@8 of the held-back labels, plain and through `W` (percent).
    pub plain: f64,
    pub adapted: f64,
    pub seconds: f64,
}

impl Judged {
    pub fn margin(&self) -> f64 {
        self.adapted - self.plain
    }

    pub fn served(&self) -> bool {
        self.margin() >= MARGIN
    }
}

/// Fits `W` on the examples that teach, judges it on those of the requests held back, and, if
/// it passes, fits it again on every example that teaches. Examples that do not teach take no
/// part, not even in the judging: one principal's labels alone (which never teach) must not
/// decide whether `W` is served. The adapter to serve (if it passed) and how it went; `None` if
/// nothing teaches on either side or `should_stop` ended it.
pub fn fit_and_judge(
    examples: &[Example],
    tools: &[f32],
    dim: usize,
    settings: Settings,
    seed: u64,
    should_stop: &dyn Fn() -> bool,
) -> Option<(Option<Adapter>, Judged)> {
    let started = std::time::Instant::now();
    // A keyed hash of each request orders them, the same on every replica; the first fifth
    // (at least one, and never all) is held back.
    let key = |e: &Example| e.request.wrapping_add(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut requests: Vec<u64> = examples.iter().filter(|e| e.teaches).map(key).collect();
    requests.sort_unstable();
    requests.dedup();
    if requests.len() < 2 {
        return None;
    }
    let held = ((requests.len() as f64 * HELD_OUT).round() as usize).clamp(1, requests.len() - 1);
    let cut = requests[held - 1];
    let (back, train): (Vec<&Example>, Vec<&Example>) =
        examples.iter().filter(|e| e.teaches).partition(|e| key(e) <= cut);
    let train: Vec<Example> = train.into_iter().cloned().collect();
    let back: Vec<Example> = back.into_iter().cloned().collect();
    if train.is_empty() || back.is_empty() {
        return None;
    }
    let trial = fit(&train, tools, dim, settings, seed, should_stop)?;
    let plain = recall(&back, tools, dim, None);
    let adapted = recall(&back, tools, dim, Some(&trial));
    let mut judged = Judged { fitted: train.len(), held_out: back.len(), plain, adapted, seconds: 0.0 };
    let served = if judged.served() {
        let all: Vec<Example> = examples.iter().filter(|e| e.teaches).cloned().collect();
        judged.fitted = all.len();
        Some(fit(&all, tools, dim, settings, seed, should_stop)?)
    } else {
        None
    };
    judged.seconds = started.elapsed().as_secs_f64();
    Some((served, judged))
}

/// Recall@8 (percent) of `examples` over `tools`, each request through `adapter` if given.
pub fn recall(examples: &[Example], tools: &[f32], dim: usize, adapter: Option<&Adapter>) -> f64 {
    if examples.is_empty() {
        return 0.0;
    }
    let rows = tools.len() / dim;
    let mut found = 0.0;
    let mut total = 0.0;
    for e in examples {
        let q = adapter.map_or_else(|| e.query.clone(), |a| a.apply(&e.query));
        let gold = dot(&tools[e.target * dim..][..dim], &q);
        let above = (0..rows).filter(|&r| r != e.target && dot(&tools[r * dim..][..dim], &q) > gold).count();
        total += e.weight as f64;
        if above < GUARD_DEPTH {
            found += e.weight as f64;
        }
    }
    100.0 * found / total.max(f64::MIN_POSITIVE)
}

/// Fits `W` on `examples`; `None` if stopped or if the fit did not stay finite.
pub fn fit(
    examples: &[Example],
    tools: &[f32],
    dim: usize,
    settings: Settings,
    seed: u64,
    should_stop: &dyn Fn() -> bool,
) -> Option<Adapter> {
    let rows = tools.len() / dim;
    if examples.is_empty() || rows == 0 {
        return None;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let hard = if rows > FULL_SOFTMAX { hardest(examples, tools, dim, should_stop)? } else { Vec::new() };
    let mut adapter = Adapter::identity(dim);
    let identity = Adapter::identity(dim).w;
    let mut adam = Adam::new(dim * dim);
    let mut order: Vec<usize> = (0..examples.len()).collect();
    let b = settings.batch.max(1);
    let mut q = vec![0.0; b * dim];
    let mut u = vec![0.0; b * dim];
    let mut grad_v = vec![0.0; b * dim];
    let mut grad_w = vec![0.0; dim * dim];
    for _ in 0..settings.epochs {
        order.shuffle(&mut rng);
        for batch in order.chunks(b) {
            if should_stop() {
                return None;
            }
            let n = batch.len();
            for (i, &e) in batch.iter().enumerate() {
                q[i * dim..][..dim].copy_from_slice(&examples[e].query);
            }
            // u = W q for each request of the batch, then v = u / |u|.
            matmul(&mut u, &q, false, &adapter.w, true, n, dim, dim);
            let norms: Vec<f32> =
                (0..n).map(|i| dot(&u[i * dim..][..dim], &u[i * dim..][..dim]).sqrt().max(1e-12)).collect();
            let v: Vec<f32> = (0..n * dim).map(|j| u[j] / norms[j / dim]).collect();
            // The tools this batch is scored against, and where each label's tool is among them.
            let (candidates, targets) = candidates(batch, examples, &hard, rows, &mut rng);
            let c = candidates.as_ref().map_or(rows, Vec::len);
            let gathered;
            let matrix: &[f32] = match &candidates {
                None => tools,
                Some(list) => {
                    gathered = list.iter().flat_map(|&r| tools[r * dim..][..dim].iter().copied()).collect::<Vec<f32>>();
                    &gathered
                }
            };
            let mut scores = vec![0.0; n * c];
            matmul(&mut scores, &v, false, matrix, true, n, dim, c);
            // d(loss)/d(score): softmax minus the one-hot label, weighted, over the batch.
            let weight_sum: f32 = batch.iter().map(|&e| examples[e].weight).sum::<f32>().max(1e-12);
            for (i, &e) in batch.iter().enumerate() {
                let row = &mut scores[i * c..][..c];
                let max = row.iter().fold(f32::MIN, |m, &s| m.max(s)) / settings.temperature;
                let mut sum = 0.0;
                for s in row.iter_mut() {
                    *s = (*s / settings.temperature - max).exp();
                    sum += *s;
                }
                let scale = examples[e].weight / weight_sum / settings.temperature;
                row.iter_mut().for_each(|s| *s = *s / sum * scale);
                row[targets[i]] -= scale;
            }
            // Back through the cosine, the normalisation and the product.
            matmul(&mut grad_v, &scores, false, matrix, false, n, c, dim);
            for i in 0..n {
                let (gv, vi) = (&mut grad_v[i * dim..][..dim], &v[i * dim..][..dim]);
                let along = dot(gv, vi);
                gv.iter_mut().zip(vi).for_each(|(g, x)| *g = (*g - along * x) / norms[i]);
            }
            matmul(&mut grad_w, &grad_v, true, &q, false, dim, n, dim);
            adam.step(&mut adapter.w, &grad_w, settings.learning_rate);
            let pull = settings.learning_rate * settings.decay;
            adapter.w.iter_mut().zip(&identity).for_each(|(w, i)| *w -= pull * (*w - i));
        }
    }
    adapter.is_finite().then_some(adapter)
}

/// For each example, the rows of the [`HARD`] tools the plain cosine ranks highest besides its
/// own; `None` if stopped.
fn hardest(examples: &[Example], tools: &[f32], dim: usize, should_stop: &dyn Fn() -> bool) -> Option<Vec<Vec<usize>>> {
    const CHUNK: usize = 64;
    let rows = tools.len() / dim;
    let mut out = Vec::with_capacity(examples.len());
    let mut scores = vec![0.0; CHUNK * rows];
    for chunk in examples.chunks(CHUNK) {
        if should_stop() {
            return None;
        }
        let q: Vec<f32> = chunk.iter().flat_map(|e| e.query.iter().copied()).collect();
        matmul(&mut scores, &q, false, tools, true, chunk.len(), dim, rows);
        for (i, e) in chunk.iter().enumerate() {
            let row = &scores[i * rows..][..rows];
            let mut idx: Vec<usize> = (0..rows).filter(|&r| r != e.target).collect();
            let k = HARD.min(idx.len());
            if k > 0 {
                idx.select_nth_unstable_by(k - 1, |&a, &b| row[b].total_cmp(&row[a]));
            }
            idx.truncate(k);
            out.push(idx);
        }
    }
    Some(out)
}

/// The rows a batch is scored against: `None` for the whole catalog, else the batch's own tools,
/// their requests' hardest tools and a random sample; and each example's place among them.
fn candidates(
    batch: &[usize],
    examples: &[Example],
    hard: &[Vec<usize>],
    rows: usize,
    rng: &mut rand::rngs::StdRng,
) -> (Option<Vec<usize>>, Vec<usize>) {
    if hard.is_empty() {
        return (None, batch.iter().map(|&e| examples[e].target).collect());
    }
    let mut list = Vec::new();
    let mut at = std::collections::HashMap::new();
    let mut add = |r: usize, list: &mut Vec<usize>| {
        *at.entry(r).or_insert_with(|| {
            list.push(r);
            list.len() - 1
        })
    };
    let targets = batch.iter().map(|&e| add(examples[e].target, &mut list)).collect();
    for &e in batch {
        hard[e].iter().for_each(|&r| {
            add(r, &mut list);
        });
    }
    for r in rand::seq::index::sample(rng, rows, RANDOM.min(rows)) {
        add(r, &mut list);
    }
    (Some(list), targets)
}

/// Adam (Kingma & Ba), the usual constants.
struct Adam {
    m: Vec<f32>,
    v: Vec<f32>,
    t: i32,
}

impl Adam {
    fn new(n: usize) -> Self {
        Self { m: vec![0.0; n], v: vec![0.0; n], t: 0 }
    }

    fn step(&mut self, w: &mut [f32], g: &[f32], lr: f32) {
        const B1: f32 = 0.9;
        const B2: f32 = 0.999;
        self.t += 1;
        let (c1, c2) = (1.0 - B1.powi(self.t), 1.0 - B2.powi(self.t));
        for ((w, g), (m, v)) in w.iter_mut().zip(g).zip(self.m.iter_mut().zip(self.v.iter_mut())) {
            *m = B1 * *m + (1.0 - B1) * g;
            *v = B2 * *v + (1.0 - B2) * g * g;
            *w -= lr * (*m / c1) / ((*v / c2).sqrt() + 1e-8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(v: Vec<f32>) -> Vec<f32> {
        let n = dot(&v, &v).sqrt();
        v.into_iter().map(|x| x / n).collect()
    }

    /// A toy deployment of `dim` tools: its users ask for tool `t` (odd) in words that point at
    /// tool `t − 1` and, less, at the `others` tools after it — the plain cosine ranks `t` below
    /// them all, and `W` can learn the way they speak.
    fn toy(dim: usize, others: usize) -> (Vec<f32>, Vec<Example>, usize) {
        let mut tools = Vec::new();
        for t in 0..dim {
            let mut v = vec![0.05; dim];
            v[t] = 1.0;
            tools.extend(unit(v));
        }
        let mut examples = Vec::new();
        for r in 0..400u64 {
            let t = (r as usize % (dim / 2)) * 2 + 1;
            let mut q = vec![0.0; dim];
            q[t - 1] = 1.0;
            q[t] = 0.2;
            (1..=others).for_each(|j| q[(t + 2 * j) % dim] += 0.5);
            q[(r as usize * 7) % dim] += 0.1;
            examples.push(Example { query: unit(q), target: t, weight: 1.0, request: r, teaches: true });
        }
        (tools, examples, dim)
    }

    /// Enough steps for the toy's few batches.
    const TOY: Settings = Settings { temperature: 0.05, learning_rate: 5e-3, decay: 0.1, epochs: 40, batch: 32 };

    #[test]
    fn identity_changes_nothing_and_apply_normalises() {
        let a = Adapter::identity(3);
        let q = unit(vec![1.0, 2.0, 2.0]);
        assert_eq!(a.apply(&q), q);
        assert_eq!(a.distance(), 0.0);
        let mut b = a.clone();
        b.w[0] = 3.0;
        let out = b.apply(&q);
        assert!((dot(&out, &out) - 1.0).abs() < 1e-5);
        assert!(b.distance() > 1.9);
        // Another dimension goes through untouched.
        assert_eq!(a.apply(&[1.0, 0.0]), vec![1.0, 0.0]);
    }

    #[test]
    fn matmul_matches_the_loops_in_every_layout() {
        let (m, k, n) = (3, 4, 5);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.25).sin()).collect();
        let want: Vec<f32> = (0..m * n).map(|o| (0..k).map(|l| a[(o / n) * k + l] * b[l * n + o % n]).sum()).collect();
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut out = vec![0.0; m * n];
            matmul(&mut out, if ta { &at } else { &a }, ta, if tb { &bt } else { &b }, tb, m, k, n);
            for (x, y) in out.iter().zip(&want) {
                assert!((x - y).abs() < 1e-4, "{ta} {tb}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn a_fit_learns_how_users_speak_and_the_guard_lets_it_in() {
        let (tools, examples, dim) = toy(32, 9);
        assert_eq!(recall(&examples, &tools, dim, None), 0.0, "the plain cosine misses every one");
        let (served, judged) = fit_and_judge(&examples, &tools, dim, TOY, 7, &|| false).unwrap();
        assert!(judged.held_out > 40 && judged.fitted == examples.len(), "{judged:?}");
        assert!(judged.served() && judged.adapted > 90.0, "{judged:?}");
        let adapter = served.expect("served");
        assert!(recall_at_1(&examples, &tools, dim, Some(&adapter)) > 0.9);
    }

    #[test]
    fn the_guard_keeps_the_identity_when_there_is_nothing_to_gain() {
        // Eight tools: recall@8 finds everything either way.
        let (tools, examples, dim) = toy(8, 0);
        let (served, judged) = fit_and_judge(&examples, &tools, dim, TOY, 7, &|| false).unwrap();
        assert!(!judged.served() && served.is_none(), "{judged:?}");
        // Examples that may not teach only judge: with none that teaches there is no fit.
        let judging: Vec<Example> = examples.into_iter().map(|e| Example { teaches: false, ..e }).collect();
        assert!(fit_and_judge(&judging, &tools, dim, TOY, 7, &|| false).is_none());
    }

    #[test]
    fn sampled_batches_learn_too() {
        // Past FULL_SOFTMAX the batches sample: the same toy, padded with far-away tools.
        let (mut tools, examples, dim) = toy(32, 9);
        let far = unit((0..dim).map(|i| if i % 2 == 0 { -1.0 } else { -0.5 }).collect());
        for _ in 0..FULL_SOFTMAX {
            tools.extend(&far);
        }
        let adapter = fit(&examples, &tools, dim, TOY, 7, &|| false).unwrap();
        assert!(recall_at_1(&examples, &tools, dim, Some(&adapter)) > 0.9);
    }

    #[test]
    fn a_stop_ends_a_fit() {
        let (tools, examples, dim) = toy(8, 0);
        assert!(fit(&examples, &tools, dim, TOY, 1, &|| true).is_none());
    }

    fn recall_at_1(examples: &[Example], tools: &[f32], dim: usize, adapter: Option<&Adapter>) -> f64 {
        let rows = tools.len() / dim;
        let hits = examples
            .iter()
            .filter(|e| {
                let q = adapter.map_or_else(|| e.query.clone(), |a| a.apply(&e.query));
                let best = (0..rows)
                    .max_by(|&a, &b| dot(&tools[a * dim..][..dim], &q).total_cmp(&dot(&tools[b * dim..][..dim], &q)));
                best == Some(e.target)
            })
            .count();
        hits as f64 / examples.len() as f64
    }
}
