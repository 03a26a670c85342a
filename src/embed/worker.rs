//! The model's one owner: a dedicated thread fed by a bounded queue, answering through oneshot
//! channels. The async side never blocks on the model; a full queue is an `Overloaded` answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::files::ModelFiles;
use super::model::SentenceModel;
use super::{EmbedError, Embedder};

/// Jobs that may wait for the model before callers are told it is overloaded.
pub const QUEUE_DEPTH: usize = 256;

struct Job {
    texts: Vec<String>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>,
}

pub struct ModelEmbedder {
    tx: mpsc::Sender<Job>,
    id: String,
    dim: usize,
    /// Set by tests to make every call fail, as a crashed model would.
    failing: Arc<AtomicBool>,
}

impl ModelEmbedder {
    /// Loads the model (on the calling thread, so load errors surface here) and starts its thread.
    pub fn start(files: &ModelFiles) -> anyhow::Result<Self> {
        let model = SentenceModel::load(files)?;
        let (id, dim) = (model.id().to_string(), model.dim());
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        std::thread::Builder::new().name("toolmux-embed".into()).spawn(move || {
            while let Some(job) = rx.blocking_recv() {
                let texts: Vec<&str> = job.texts.iter().map(String::as_str).collect();
                let result = model.embed_all(&texts).map_err(|e| EmbedError::Model(e.to_string()));
                let _ = job.reply.send(result);
            }
        })?;
        Ok(Self { tx, id, dim, failing: Arc::new(AtomicBool::new(false)) })
    }

    /// A switch that makes every later call fail (for fallback tests).
    pub fn failure_switch(&self) -> Arc<AtomicBool> {
        self.failing.clone()
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
