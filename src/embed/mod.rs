//! Text → unit vectors. The candle model lives here and only here.
//!
//! [`Embedder`] is what the store asks for vectors; [`worker::ModelEmbedder`] runs the real model
//! ([`model`]: tokenizer and the packed BERT encoder of `bert`, with its CPU kernels in
//! `kernels`) on its own thread behind a bounded queue, [`fake::FakeEmbedder`] is a deterministic stand-in
//! for unit tests. [`files`] finds and verifies the model files; [`cache`] keeps vectors on disk
//! by content hash so a restart does not run the model on an unchanged catalog.

mod bert;
pub mod cache;
mod checkpoint;
pub mod fake;
pub mod files;
mod kernels;
pub mod model;
pub mod worker;

use futures::future::BoxFuture;

#[derive(Debug, Clone, thiserror::Error)]
pub enum EmbedError {
    #[error("the embedding queue is full ({0} jobs waiting); try again shortly")]
    Overloaded(usize),
    #[error("the embedding model is not running")]
    Stopped,
    #[error("the embedding model failed: {0}")]
    Model(String),
}

/// Something that turns texts into L2-normalised vectors of [`Embedder::dim`] floats.
pub trait Embedder: Send + Sync + 'static {
    /// Identifies the model and revision; part of every cache key.
    fn model_id(&self) -> &str;
    fn dim(&self) -> usize;
    /// One vector per text, in order.
    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, EmbedError>>;
    /// Jobs waiting for the model now.
    fn queue_depth(&self) -> usize {
        0
    }
    /// The encoder's arithmetic, for a real model.
    fn precision(&self) -> Option<crate::config::Precision> {
        None
    }
}

/// Scales a vector to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}
