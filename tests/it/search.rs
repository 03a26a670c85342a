//! Search with the real model: embedding correctness, ranking quality on the demo catalog,
//! allow-list isolation, keyword fallback and the vector cache across a restart.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use toolmux::app::{App, EmbedderChoice, Options};
use toolmux::config::Config;
use toolmux::embed::Embedder;

use crate::harness::*;

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb: f32 = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb)
}

fn golden() -> Vec<(String, Vec<f32>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/all-MiniLM-L6-v2.golden.jsonl");
    let text = std::fs::read_to_string(path).expect("tests/fixtures/all-MiniLM-L6-v2.golden.jsonl");
    let golden: Vec<(String, Vec<f32>)> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let e = v["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
            (v["text"].as_str().unwrap().to_string(), e)
        })
        .collect();
    golden
}

#[tokio::test]
async fn embeddings_match_sentence_transformers() {
    let golden = golden();
    assert!(golden.iter().any(|(t, _)| t.is_empty()), "the empty string is covered");
    assert!(golden.iter().any(|(t, _)| t.len() > 2000), "an over-long text is covered");
    let m = model();
    let batch = m.embed(golden.iter().map(|(t, _)| t.clone()).collect()).await.unwrap();
    let mut lowest = 1.0f32;
    for ((t, want), got) in golden.iter().zip(&batch) {
        assert_eq!(got.len(), 384);
        let c = cosine(want, got);
        lowest = lowest.min(c);
        assert!(c >= 0.999, "cosine {c} for {t:?}");
        let single = m.embed(vec![t.clone()]).await.unwrap().remove(0);
        let agree = cosine(&single, got);
        assert!(agree >= 0.9999, "batch and single disagree ({agree}) for {t:?}");
    }
    eprintln!("golden vectors: {} texts, lowest cosine {lowest:.7}", golden.len());
}

/// The int8 encoder (`optimizer.precision = "int8"`) against sentence-transformers' f32 vectors:
/// every fixture text keeps cosine ≥ 0.995, and a text's vector does not depend on its batch.
#[tokio::test]
async fn int8_embeddings_stay_close_to_sentence_transformers() {
    let golden = golden();
    let m = model_int8();
    // int8 vectors are cached apart from f32's, and the AVX2 kernel's 7-bit weights' apart too.
    let kernel = m.precision().and_then(|p| p.kernel()).expect("an int8 model");
    let suffix = format!("+int8{}", kernel.weights_suffix());
    assert!(m.model_id().ends_with(&suffix), "{kernel}: {} should end with {suffix}", m.model_id());
    let batch = m.embed(golden.iter().map(|(t, _)| t.clone()).collect()).await.unwrap();
    let mut lowest = 1.0f32;
    for ((t, want), got) in golden.iter().zip(&batch) {
        let c = cosine(want, got);
        lowest = lowest.min(c);
        assert!(c >= 0.995, "int8 cosine {c} for {t:?}");
        // Our own kernels run unoptimised in tests: the long text is left out of this check.
        if t.len() < 200 {
            let single = m.embed(vec![t.clone()]).await.unwrap().remove(0);
            assert!(cosine(&single, got) >= 0.9999, "batch and single disagree for {t:?}");
        }
    }
    eprintln!("golden vectors, int8: {} texts, lowest cosine {lowest:.7}", golden.len());
}

/// Every demo backend in this process, and the gateway in front (optimizer mode).
/// Requests that wait together run together (real model): sixty at once take fewer encoder
/// passes than requests, and each gets exactly the vector it would get alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_share_encoder_passes_and_keep_their_own_vectors() {
    // Its own model: the shared one's counters also count the other tests' requests.
    let m = model_of_its_own(toolmux::config::Precision::F32);
    let texts: Vec<String> = (0..60).map(|i| format!("send message number {i} to the team channel")).collect();
    let alone: Vec<Vec<f32>> = {
        let mut out = Vec::new();
        for t in &texts[..5] {
            out.push(m.embed(vec![t.clone()]).await.unwrap().remove(0));
        }
        out
    };
    let (passes, answered) = m.passes();
    let together = futures::future::join_all(texts.iter().map(|t| m.embed(vec![t.clone()]))).await;
    let (passes, answered) = (m.passes().0 - passes, m.passes().1 - answered);
    assert_eq!(answered, 60);
    assert!(passes < answered, "{passes} passes for {answered} requests: nothing was batched");
    for (i, v) in together.into_iter().enumerate() {
        let v = v.unwrap().remove(0);
        assert_eq!(v.len(), 384);
        if i < alone.len() {
            assert!(cosine(&v, &alone[i]) > 0.99999, "request {i} got another's vector");
        }
    }
    println!("60 concurrent requests: {passes} encoder passes");
}

async fn demo_gateway(extra: &str, opts: Options) -> (App, Vec<HttpBackend>) {
    let mut toml = format!("[server]\nlisten = \"127.0.0.1:0\"\n{extra}");
    let mut servers = Vec::new();
    for b in toolmux::demo::backends() {
        let s = http_backend(&b.name).await;
        toml.push_str(&http_backend_toml(&b.name, &s.url));
        servers.push(s);
    }
    let app = App::start(Config::parse(&toml).unwrap(), opts).await.unwrap();
    assert!(app.ready(std::time::Duration::from_secs(120)).await);
    (app, servers)
}

fn with_model() -> Options {
    Options { embedder: EmbedderChoice::Given(model()), ..Options::default() }
}

#[tokio::test]
async fn the_reference_quality_queries_rank_within_the_top_8() {
    let (app, _servers) =
        demo_gateway(&format!("[optimizer]\ncache_dir = \"{}\"\n", shared_cache_dir()), with_model()).await;
    let (c, _) = client(&app).await;
    let cases = [
        ("repeat or echo back a message", "echo"),
        ("retrieve content from a web page or URL", "fetch"),
        ("check security vulnerabilities in open source packages", "vulnerabilit"),
        ("create a pull request on a code repository", "pull_request"),
    ];
    for (query, want) in cases {
        let r = call(&c, "find_tool", json!({"tool_description": query})).await;
        let names = found(&r);
        assert_eq!(names.len(), 8);
        assert!(names.iter().any(|n| n.contains(want)), "{query:?} → {names:?}");
        assert_eq!(r.structured_content.unwrap()["search_mode"], "hybrid");
    }
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// Two servers offer the same tool under names that say nothing of them (`b1_search`,
/// `b2_search`, one description); only their `serverInfo` titles differ. find_tool tells them
/// apart by the title.
#[tokio::test]
async fn find_tool_reads_the_servers_title() {
    let text = "== b1 | A server\nsearch | Search for items by keyword. | query*: Words to look for\n\
        == b2 | A server\nsearch | Search for items by keyword. | query*: Words to look for\n";
    let mut toml = format!("[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\ncache_dir = \"{}\"\n", shared_cache_dir());
    let mut servers = Vec::new();
    for (mut b, title) in
        toolmux::demo::parse(text).unwrap().into_iter().zip(["Jira issue tracker", "Spotify music library"])
    {
        b.title = Some(title.to_string());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let ct = tokio_util::sync::CancellationToken::new();
        toml.push_str(&http_backend_toml(&b.name, &url));
        tokio::spawn(toolmux::demo::serve_http(b, listener, ct.clone()));
        servers.push(ct.drop_guard());
    }
    let app = App::start(Config::parse(&toml).unwrap(), with_model()).await.unwrap();
    assert!(app.ready(Duration::from_secs(120)).await);
    let (c, _) = client(&app).await;
    for (request, want) in
        [("find a song in my music library", "b2_search"), ("look up a bug ticket in the issue tracker", "b1_search")]
    {
        let names = found(&call(&c, "find_tool", json!({"tool_description": request})).await);
        assert_eq!(names.first().map(String::as_str), Some(want), "{request:?} → {names:?}");
    }
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// Every answer says how well it matched: `good` with per-tool scores for a request the demo
/// catalog serves, a flag (`weak`/`none`) and a plain note for one it cannot ("book a flight to
/// Paris" only finds calendar tools) and for a request in a script the model cannot read; the
/// tools are returned either way. A request of two parts gets tools for both.
#[tokio::test]
async fn find_tool_says_how_well_it_matched_and_serves_each_part_of_a_request() {
    let (app, _servers) =
        demo_gateway(&format!("[optimizer]\ncache_dir = \"{}\"\n", shared_cache_dir()), with_model()).await;
    let (c, _) = client(&app).await;
    let answer = |r: rmcp::model::CallToolResult| r.structured_content.expect("structured content");

    let good =
        answer(call(&c, "find_tool", json!({"tool_description": "create a pull request on a code repository"})).await);
    assert_eq!(good["match"], "good", "{good}");
    assert!(good.get("note").is_none());
    let scores: Vec<f64> = good["scores"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect();
    assert_eq!(scores.len(), good["tools"].as_array().unwrap().len());
    assert!(scores.iter().all(|s| (-1.0..=1.0).contains(s)));
    assert!(scores[0] >= toolmux::store::WEAK_BELOW as f64, "{scores:?}");

    for request in ["book a flight to Paris for next Tuesday", "帮我预订一张去巴黎的机票"] {
        let r = answer(call(&c, "find_tool", json!({"tool_description": request})).await);
        assert_ne!(r["match"], "good", "{request:?} → {r}");
        assert_eq!(r["tools"].as_array().unwrap().len(), 8, "the closest tools are still returned");
        assert!(r["note"].as_str().is_some_and(|n| !n.is_empty()), "{r}");
    }
    let chinese = answer(call(&c, "find_tool", json!({"tool_description": "帮我预订一张去巴黎的机票"})).await);
    assert_eq!(chinese["match"], "none");
    assert!(chinese["note"].as_str().unwrap().contains("English"), "{chinese}");

    let both = call(
        &c,
        "find_tool",
        json!({"tool_description": "Create a pull request on my repository. Also, list the storage buckets of our cloud account."}),
    )
    .await;
    let names = found(&both);
    assert!(names.iter().any(|n| n.contains("pull_request")), "{names:?}");
    assert!(names.iter().any(|n| n.contains("bucket")), "{names:?}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// `[auth]` with two bearer tokens: `chat-only` (principal `chat`, which policy limits to the
/// slack backend) and `everything` (principal `ops`, every backend).
fn two_principals() -> String {
    let digest = |t: &str| base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(t.as_bytes()));
    format!(
        "[auth]\nmode = \"bearer\"\n\
         [[auth.tokens]]\nprincipal = \"chat\"\nsha256 = \"{}\"\n\
         [[auth.tokens]]\nprincipal = \"ops\"\ngroups = [\"admins\"]\nsha256 = \"{}\"\n\
         [[policy]]\nprincipals = [\"chat\"]\nbackends = [\"slack\"]\n\
         [[policy]]\ngroups = [\"admins\"]\nbackends = [\"*\"]\n",
        digest("chat-only"),
        digest("everything")
    )
}

#[tokio::test]
async fn two_sessions_with_different_scopes_never_see_each_others_tools() {
    let extra = format!("[optimizer]\ncache_dir = \"{}\"\n{}", shared_cache_dir(), two_principals());
    let (app, _servers) = demo_gateway(&extra, with_model()).await;
    let (narrow, _) = client_with_auth(&app, Some("chat-only")).await;
    let (wide, _) = client_with_auth(&app, Some("everything")).await;
    for query in ["create a pull request on a code repository", "send a chat message", "query the SQL database"] {
        let n = found(&call(&narrow, "find_tool", json!({"tool_description": query})).await);
        assert!(!n.is_empty() && n.iter().all(|t| t.starts_with("slack_")), "{query:?} → {n:?}");
        let w = found(&call(&wide, "find_tool", json!({"tool_description": query})).await);
        assert!(w.iter().any(|t| !t.starts_with("slack_")), "{query:?} → {w:?}");
    }
    let r = call(
        &narrow,
        "call_tool",
        json!({"tool_name": "github_create_issue", "parameters": {"owner": "a", "repo": "b", "title": "c"}}),
    )
    .await;
    assert!(text(&r).starts_with("tool not found"), "{}", text(&r));
    let r = call(
        &wide,
        "call_tool",
        json!({"tool_name": "github_create_issue", "parameters": {"owner": "a", "repo": "b", "title": "c"}}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    narrow.cancel().await.unwrap();
    wide.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn find_tool_falls_back_to_keywords_when_the_model_fails() {
    let files =
        toolmux::embed::files::locate("all-MiniLM-L6-v2", None, &toolmux::embed::files::default_model_roots(), false)
            .unwrap();
    let own = Arc::new(toolmux::embed::worker::ModelEmbedder::start(&files).unwrap());
    let switch = own.failure_switch();
    let opts = Options { embedder: EmbedderChoice::Given(own), ..Options::default() };
    let (app, _servers) = demo_gateway(&format!("[optimizer]\ncache_dir = \"{}\"\n", shared_cache_dir()), opts).await;
    let (c, _) = client(&app).await;
    switch.store(true, Ordering::SeqCst);
    let r = call(
        &c,
        "find_tool",
        json!({"tool_description": "a never seen query about pull requests", "tool_keywords": ["pull", "request"]}),
    )
    .await;
    assert_ne!(r.is_error, Some(true));
    assert_eq!(r.structured_content.clone().unwrap()["search_mode"], "keyword");
    let names = found(&r);
    assert!(names.iter().take(3).any(|n| n.contains("pull_request")), "{names:?}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

#[tokio::test]
async fn a_restart_with_an_unchanged_catalog_runs_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("[optimizer]\ncache_dir = \"{}\"\n", dir.path().display());
    let (app, servers) = demo_gateway(&extra, with_model()).await;
    let first = app.gateway.store.counters.texts_embedded.load(Ordering::Relaxed);
    assert!(first >= 150, "first start embeds the catalog ({first})");
    app.shutdown().await;
    drop(servers);

    let (app, _servers) = demo_gateway(&extra, with_model()).await;
    assert_eq!(app.gateway.store.counters.texts_embedded.load(Ordering::Relaxed), 0);
    let (c, _) = client(&app).await;
    let names = found(&call(&c, "find_tool", json!({"tool_description": "echo back a message"})).await);
    assert!(names.iter().any(|n| n == "echo_echo"), "{names:?}");
    c.cancel().await.unwrap();
    app.shutdown().await;
}

/// A catalog build whose texts cannot be embedded serves keyword search, shows the failure in
/// `/status` and the metrics, and is retried with backoff until the model answers again.
#[tokio::test]
async fn an_embedding_failure_is_retried_until_search_is_hybrid_again() {
    let files =
        toolmux::embed::files::locate("all-MiniLM-L6-v2", None, &toolmux::embed::files::default_model_roots(), false)
            .unwrap();
    let own = Arc::new(toolmux::embed::worker::ModelEmbedder::start(&files).unwrap());
    let switch = own.failure_switch();
    switch.store(true, Ordering::SeqCst);
    let kit = http_backend("testkit").await;
    let cache = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[optimizer]\ncache_dir = \"{}\"\n{}",
        cache.path().display(),
        http_backend_toml("kit", &kit.url)
    );
    let app = gateway(&toml, EmbedderChoice::Given(own)).await;
    let status = app.gateway.status();
    assert_eq!((status.embedder.state, status.catalog.search), ("failed", "keyword"));
    assert!(app.gateway.render_metrics().contains("toolmux_embed_failures_total 1"));

    switch.store(false, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(30), || async { app.gateway.status().catalog.search == "hybrid" }).await,
        "the build is retried once the model answers"
    );
    let embedder = app.gateway.status().embedder;
    assert_eq!(embedder.state, "ok");
    // Which arithmetic and kernel run, and why (`ModelEmbedder::start` takes `auto`).
    let precision = toolmux::config::Precision::default();
    assert_eq!(embedder.precision, Some(precision.name()));
    assert_eq!(embedder.int8_kernel, precision.kernel().map(|k| k.name()));
    assert_eq!(embedder.int8_kernel_why.is_some(), precision.kernel().is_some(), "{:?}", embedder.int8_kernel_why);
    let (c, _) = client(&app).await;
    let r = call(&c, "find_tool", json!({"tool_description": "echo back a message"})).await;
    assert_eq!(r.structured_content.unwrap()["search_mode"], "hybrid");
    c.cancel().await.unwrap();
    app.shutdown().await;
}
