//! A plain HTTP load balancer in front of the replicas of a test.

use super::*;

/// A plain HTTP load balancer: each request goes to the next replica in turn; a replica that
/// refuses the connection, or answers 503 (stopping), is skipped for the next, as a balancer's
/// passive health checks would. The body is buffered, the answer streamed back.
pub(super) struct Balancer {
    pub(super) url: String,
    targets: Arc<Mutex<Vec<String>>>,
    /// Requests answered, by replica base URL.
    hits: Arc<Mutex<HashMap<String, usize>>>,
    ct: CancellationToken,
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.ct.cancel();
    }
}

impl Balancer {
    pub(super) async fn start(targets: Vec<String>) -> Self {
        let targets = Arc::new(Mutex::new(targets));
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let next = Arc::new(AtomicUsize::new(0));
        let http = reqwest::Client::new();
        let (t, h) = (targets.clone(), hits.clone());
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let (targets, hits, next, http) = (t.clone(), h.clone(), next.clone(), http.clone());
            async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, 16 << 20).await.unwrap_or_default();
                let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
                let live = targets.lock().unwrap().clone();
                for _ in 0..live.len().max(1) * 2 {
                    let Some(base) = live.get(next.fetch_add(1, Ordering::Relaxed) % live.len().max(1)).cloned() else {
                        break;
                    };
                    let mut forward = http.request(parts.method.clone(), format!("{base}{path}")).body(body.clone());
                    for (k, v) in &parts.headers {
                        if k != "host" && k != "content-length" {
                            forward = forward.header(k, v);
                        }
                    }
                    let Ok(answer) = forward.send().await else { continue };
                    if answer.status() == 503 {
                        continue;
                    }
                    *hits.lock().unwrap().entry(base).or_default() += 1;
                    let mut response = axum::response::Response::builder().status(answer.status());
                    for (k, v) in answer.headers() {
                        response = response.header(k, v);
                    }
                    return response.body(axum::body::Body::from_stream(answer.bytes_stream())).unwrap();
                }
                axum::response::Response::builder()
                    .status(502)
                    .body(axum::body::Body::from("no replica answered"))
                    .unwrap()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let ct = CancellationToken::new();
        let stop = ct.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await }).await;
        });
        Self { url, targets, hits, ct }
    }

    pub(super) fn set_targets(&self, targets: Vec<String>) {
        *self.targets.lock().unwrap() = targets;
    }

    pub(super) fn hits(&self, base: &str) -> usize {
        self.hits.lock().unwrap().get(base).copied().unwrap_or(0)
    }
}
