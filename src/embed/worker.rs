//! The model's one owner: a dedicated thread fed by a bounded queue, answering through oneshot
//! channels. The async side never blocks on the model; a full queue is an `Overloaded` answer.
//!
//! Requests that wait together run together (dynamic batching): the thread takes the job at the
//! head of the queue and every job queued behind it, up to [`Batching::max_texts`] texts, and,
//! when others were waiting, lingers [`Batching::linger`] for more before one pass of the
//! encoder over all of them; each job gets its own vectors back. One request alone runs at
//! once. A pass streams the model's weights from memory once whatever it holds, so under load
//! throughput grows with the batch instead of staying at one request per pass. Jobs are taken
//! in the order they came: none waits behind a later one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::files::ModelFiles;
use super::model::SentenceModel;
use super::{EmbedError, Embedder};
use crate::config::Precision;

/// Jobs that may wait for the model before callers are told it is overloaded.
pub const QUEUE_DEPTH: usize = 256;

struct Job {
    texts: Vec<String>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

/// How the model thread groups waiting requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Batching {
    /// Texts in one pass at most (a job is never split: a larger one runs alone).
    pub max_texts: usize,
    /// How long to wait for more once others were waiting.
    pub linger: Duration,
}

impl Default for Batching {
    fn default() -> Self {
        Self { max_texts: 64, linger: Duration::from_micros(300) }
    }
}

impl Batching {
    /// One job per pass, as before batching (for comparison in the benchmarks).
    pub fn none() -> Self {
        Self { max_texts: 1, linger: Duration::ZERO }
    }
}

pub struct ModelEmbedder {
    tx: mpsc::Sender<Job>,
    id: String,
    dim: usize,
    /// Set by tests to make every call fail, as a crashed model would.
    failing: Arc<AtomicBool>,
    /// Encoder passes run, and requests answered: their ratio is the mean batch.
    passes: Arc<AtomicU64>,
    answered: Arc<AtomicU64>,
    precision: Precision,
}

impl ModelEmbedder {
    /// Loads the model (on the calling thread, so load errors surface here) and starts its thread.
    pub fn start(files: &ModelFiles) -> anyhow::Result<Self> {
        Self::start_with(files, Batching::default(), Precision::default())
    }

    /// [`ModelEmbedder::start`], grouping waiting requests by `batching`, the dense layers in
    /// `precision`.
    pub fn start_with(files: &ModelFiles, batching: Batching, precision: Precision) -> anyhow::Result<Self> {
        let model = SentenceModel::load(files, precision)?;
        let (id, dim) = (model.id().to_string(), model.dim());
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        let (passes, answered) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counts = (passes.clone(), answered.clone());
        // The encoder's parallel loops (its kernels', candle's, gemm's) run in a pool of the
        // model's own, and each pass runs inside it: the thread that walks the layers is one of
        // the pool's workers and takes part in every loop, instead of waiting outside while its
        // jobs are handed over and woken up, once per layer operation.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("toolmux-embed-{i}"))
            .build()?;
        std::thread::Builder::new().name("toolmux-embed".into()).spawn(move || {
            let mut next = None;
            while let Some(first) = next.take().or_else(|| rx.blocking_recv()) {
                let (jobs, leftover) = gather(first, &mut rx, batching);
                counts.0.fetch_add(1, Ordering::Relaxed);
                counts.1.fetch_add(jobs.len() as u64, Ordering::Relaxed);
                pool.install(|| run(&model, jobs));
                next = leftover;
            }
        })?;
        Ok(Self { tx, id, dim, precision, failing: Arc::new(AtomicBool::new(false)), passes, answered })
    }

    /// Encoder passes run and requests answered since start.
    pub fn passes(&self) -> (u64, u64) {
        (self.passes.load(Ordering::Relaxed), self.answered.load(Ordering::Relaxed))
    }

    /// A switch that makes every later call fail (for fallback tests).
    pub fn failure_switch(&self) -> Arc<AtomicBool> {
        self.failing.clone()
    }
}

/// `first` and the jobs queued behind it, up to `batching.max_texts` texts; lingering for more
/// only when others were already waiting (a lone request runs at once). A job that does not
/// fit is handed back: it leads the next batch, so the order is kept.
fn gather(first: Job, rx: &mut mpsc::Receiver<Job>, batching: Batching) -> (Vec<Job>, Option<Job>) {
    let mut texts = first.texts.len();
    let mut jobs = vec![first];
    let mut deadline = None;
    while texts < batching.max_texts {
        let job = match rx.try_recv() {
            Ok(job) => job,
            Err(mpsc::error::TryRecvError::Empty) => {
                let until = *deadline.get_or_insert_with(|| Instant::now() + batching.linger);
                if jobs.len() == 1 || Instant::now() >= until {
                    break;
                }
                std::thread::sleep(Duration::from_micros(20));
                continue;
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        if texts + job.texts.len() > batching.max_texts {
            return (jobs, Some(job));
        }
        texts += job.texts.len();
        jobs.push(job);
    }
    (jobs, None)
}

/// One encoder pass over every job's texts; each job gets its own vectors, or the error.
fn run(model: &SentenceModel, jobs: Vec<Job>) {
    let texts: Vec<&str> = jobs.iter().flat_map(|j| j.texts.iter().map(String::as_str)).collect();
    match model.embed_all(&texts) {
        Ok(vectors) => {
            let mut vectors = vectors.into_iter();
            for job in jobs {
                let mine: Vec<Vec<f32>> = vectors.by_ref().take(job.texts.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            let e = e.to_string();
            for job in jobs {
                let _ = job.reply.send(Err(EmbedError::Model(e.clone())));
            }
        }
    }
}

impl Embedder for ModelEmbedder {
    fn model_id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.dim
    }

    fn queue_depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    fn precision(&self) -> Option<Precision> {
        Some(self.precision)
    }

    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move {
            if self.failing.load(Ordering::Relaxed) {
                return Err(EmbedError::Model("failure injected by test".into()));
            }
            if texts.is_empty() {
                return Ok(Vec::new());
            }
            let (reply, rx) = oneshot::channel();
            self.tx.try_send(Job { texts, reply }).map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => EmbedError::Overloaded(QUEUE_DEPTH),
                mpsc::error::TrySendError::Closed(_) => EmbedError::Stopped,
            })?;
            rx.await.map_err(|_| EmbedError::Stopped)?
        })
    }
}
