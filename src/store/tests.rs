use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rmcp::model::Tool;
use serde_json::json;

use super::*;
use crate::catalog::{Aggregation, Catalog, Listing};
use crate::embed::fake::FakeEmbedder;
use futures::future::BoxFuture;

fn tool(name: &str, desc: &str) -> Tool {
    let schema = json!({"type": "object"});
    Tool::new(name.to_string(), desc.to_string(), Arc::new(schema.as_object().unwrap().clone()))
}

fn catalog() -> Catalog {
    let tools = [
        tool("echo", "Repeat back the message it is given"),
        tool("fetch_url", "Retrieve the content of a web page"),
        tool("create_pull_request", "Open a pull request on a repository"),
        tool("send_message", "Post a message to a chat channel"),
    ];
    Catalog::resolve(&[Listing { backend: "demo", tools: &tools, server: None }], &Aggregation::default()).0
}

struct Failing;
impl Embedder for Failing {
    fn model_id(&self) -> &str {
        "failing"
    }
    fn dim(&self) -> usize {
        8
    }
    fn embed(&self, _: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async { Err(EmbedError::Stopped) })
    }
}

fn names(g: &Generation, hits: &[Hit]) -> Vec<String> {
    hits.iter().map(|h| g.catalog.tools()[h.slot as usize].name().to_string()).collect()
}

/// The key of the catalog's tool called `name`.
fn key(g: &Generation, name: &str) -> crate::catalog::ToolKey {
    g.catalog.tools()[g.catalog.position(name).expect("a tool of the test catalog")].key.clone()
}

#[tokio::test]
async fn hybrid_search_stays_inside_the_allow_list() {
    let store = Store::new(Some(Arc::new(FakeEmbedder::default())), None);
    let g = store.rebuild(catalog()).await;
    let q = Query { description: "open a pull request".into(), keywords: vec![] };
    let all = AllowList::all(g.catalog.len());
    let r = store.search(&g, &all, &q, 8, Ranker::Fused).await;
    assert_eq!(r.mode, SearchMode::Hybrid);
    assert_eq!(names(&g, &r.hits)[0], "demo_create_pull_request");
    assert_eq!(r.hits.len(), 4, "backfilled to every allowed tool");

    let pr = g.catalog.position("demo_create_pull_request").unwrap() as u32;
    let without = AllowList::from_slots(g.catalog.len(), (0..4).filter(|&s| s != pr));
    let r = store.search(&g, &without, &q, 8, Ranker::Fused).await;
    assert!(!names(&g, &r.hits).contains(&"demo_create_pull_request".to_string()));
    assert!(store.search(&g, &AllowList::none(4), &q, 8, Ranker::Fused).await.hits.is_empty());
}

#[tokio::test]
async fn vectors_come_from_the_cache_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEmbedder::default());
    let cache = VectorCache::open(Some(dir.path()), fake.model_id(), fake.dim()).unwrap();
    let store = Store::new(Some(fake.clone()), Some(cache));
    store.rebuild(catalog()).await;
    assert_eq!(store.counters.texts_embedded.load(Ordering::Relaxed), 4);
    drop(store);

    let cache = VectorCache::open(Some(dir.path()), fake.model_id(), fake.dim()).unwrap();
    let store = Store::new(Some(fake), Some(cache));
    let g = store.rebuild(catalog()).await;
    assert_eq!(store.counters.texts_embedded.load(Ordering::Relaxed), 0);
    assert!(g.dense.is_some());
}

#[tokio::test]
async fn a_failing_embedder_degrades_to_keyword_search() {
    let store = Store::new(Some(Arc::new(Failing)), None);
    let g = store.rebuild(catalog()).await;
    assert!(g.dense.is_none());
    let q = Query { description: "web page content".into(), keywords: vec![] };
    let r = store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    assert_eq!(r.mode, SearchMode::Keyword);
    assert_eq!(names(&g, &r.hits), vec!["demo_fetch_url"]);
    assert_eq!(r.verdict, Verdict::Weak, "a keyword match alone is never judged good");
    assert!(r.similarity.is_empty());

    // A request the model could not read is `none` on the keyword path too, matches or not.
    let q = Query {
        description: "请获取这个网页的全部内容 web page content 并告诉我网页的标题和作者是谁".into(),
        keywords: vec![],
    };
    let r = store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    assert_eq!(names(&g, &r.hits), vec!["demo_fetch_url"]);
    assert_eq!(r.verdict, Verdict::None);
    let q = Query { description: "book a flight".into(), keywords: vec![] };
    let r = store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    assert!(r.hits.is_empty());
    assert_eq!(r.verdict, Verdict::None);
}

/// Embeds the catalog, then reports a full queue for every query.
struct Saturated {
    fake: FakeEmbedder,
    full: std::sync::atomic::AtomicBool,
}
impl Embedder for Saturated {
    fn model_id(&self) -> &str {
        "saturated"
    }
    fn dim(&self) -> usize {
        self.fake.dim
    }
    fn embed(&self, texts: Vec<String>) -> BoxFuture<'_, Result<Vec<Vec<f32>>, EmbedError>> {
        let full = self.full.load(Ordering::Relaxed);
        Box::pin(async move {
            if full {
                return Err(EmbedError::Overloaded(256));
            }
            self.fake.embed(texts).await
        })
    }
}

#[tokio::test]
async fn a_full_model_queue_is_busy_not_a_quiet_keyword_answer() {
    let e = Arc::new(Saturated { fake: FakeEmbedder::default(), full: false.into() });
    let store = Store::new(Some(e.clone()), None);
    let g = store.rebuild(catalog()).await;
    assert!(g.dense.is_some());
    e.full.store(true, Ordering::Relaxed);
    let q = Query { description: "web page content".into(), keywords: vec![] };
    let r = store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    assert_eq!(r.busy, Some(256));
    assert!(r.hits.is_empty());
    // A request whose vector is cached never waits for the model.
    e.full.store(false, Ordering::Relaxed);
    store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    e.full.store(true, Ordering::Relaxed);
    let r = store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    assert_eq!((r.busy, r.hits.is_empty()), (None, false));
}

#[tokio::test]
async fn keywords_feed_the_keyword_arm() {
    let store = Store::new(None, None);
    let g = store.rebuild(catalog()).await;
    let q = Query { description: "do the thing".into(), keywords: vec!["chat".into()] };
    let r = store.search(&g, &AllowList::all(4), &q, 8, Ranker::Fused).await;
    assert_eq!(names(&g, &r.hits), vec!["demo_send_message"]);
}

#[tokio::test]
async fn a_served_adapter_searches_with_the_offset_taken_back_from_taught_tools() {
    use crate::store::adapter::{Adapter, Judged, OFFSET};
    let fake = Arc::new(FakeEmbedder::default());
    let store = Store::new(Some(fake.clone()), None);
    let g = store.rebuild(catalog()).await;
    let all = AllowList::all(g.catalog.len());
    let q = Query { description: "post a message to the channel".into(), keywords: vec![] };
    let scores = |r: &SearchResult| -> HashMap<String, f32> {
        names(&g, &r.hits).into_iter().zip(r.hits.iter().map(|h| h.score)).collect()
    };
    let learned = learned::Learned::new(true, fake.dim, None);
    let send = key(&g, "demo_send_message");
    let echo = key(&g, "demo_echo");
    // send_message counts (two principals); echo has one principal's label only.
    learned.record(&fake.vector("tell the team"), &send, "alice");
    learned.record(&fake.vector("tell the team"), &send, "bob");
    learned.record(&fake.vector("say it again"), &echo, "alice");
    let before = scores(&store.search_learning(&g, &all, &q, 4, Ranker::DenseOnly, Some(&learned)).await);
    // The identity as `W`: the request is searched as said, and only the offset moves scores.
    let judged = Judged { fitted: 50, held_out: 10, plain: 60.0, adapted: 70.0, seconds: 0.1 };
    learned.install(learned::Fitted { adapter: Some(Adapter::identity(fake.dim)), judged, labels: 3 }, 1);
    let after = scores(&store.search_learning(&g, &all, &q, 4, Ranker::DenseOnly, Some(&learned)).await);
    assert_eq!(before.len(), 4);
    for (name, score) in &before {
        let taken = if name == "demo_send_message" { OFFSET } else { 0.0 };
        assert!((after[name] - (score - taken)).abs() < 1e-5, "{name}: {score} -> {}", after[name]);
    }
}

#[tokio::test]
async fn a_first_tool_that_requests_like_this_one_led_to_is_a_good_match() {
    let fake = Arc::new(FakeEmbedder::default());
    let store = Store::new(Some(fake.clone()), None);
    let g = store.rebuild(catalog()).await;
    let all = AllowList::all(g.catalog.len());
    let ask = |text: &str| Query { description: text.into(), keywords: vec![] };
    let send = key(&g, "demo_send_message");
    let echo = key(&g, "demo_echo");
    // No word of the request is in any tool's text: by the text alone nothing fits.
    let request = "hand over tonight's rota";
    let plain = store.search_learning(&g, &all, &ask(request), 4, Ranker::Fused, None).await;
    assert_eq!(plain.verdict, Verdict::None, "{:?}", plain.similarity);

    // Twenty principals were served by send_message after this request: it fits.
    let many = learned::Learned::new(true, fake.dim, None);
    (0..20).for_each(|p| many.record(&fake.vector(request), &send, &format!("p{p}")));
    let r = store.search_learning(&g, &all, &ask(request), 4, Ranker::Fused, Some(&many)).await;
    assert_eq!(names(&g, &r.hits)[0], "demo_send_message");
    assert_eq!(r.verdict, Verdict::Good);
    // A request unlike those keeps the verdict its text gives.
    let other =
        store.search_learning(&g, &all, &ask("compile the quarterly ledger"), 4, Ranker::Fused, Some(&many)).await;
    assert_ne!(other.verdict, Verdict::Good, "{:?}", names(&g, &other.hits));

    // One principal's labels do not count, however many: the store is active (twenty labels,
    // the others on another tool), but the verdict is the text's.
    let one = learned::Learned::new(true, fake.dim, None);
    (0..4).for_each(|_| one.record(&fake.vector(request), &send, "mallory"));
    (0..16).for_each(|p| one.record(&fake.vector("repeat these words back"), &echo, &format!("p{p}")));
    assert!(one.active());
    let r = store.search_learning(&g, &all, &ask(request), 4, Ranker::Fused, Some(&one)).await;
    assert_eq!(r.verdict, Verdict::None, "{:?}", names(&g, &r.hits));

    // A request in a script the model does not read stays `none`, familiar or not.
    let foreign = "今晚的值班表交给我";
    let taught = learned::Learned::new(true, fake.dim, None);
    (0..20).for_each(|p| taught.record(&fake.vector(foreign), &send, &format!("p{p}")));
    let r = store.search_learning(&g, &all, &ask(foreign), 4, Ranker::Fused, Some(&taught)).await;
    assert_eq!(r.verdict, Verdict::None);
}
