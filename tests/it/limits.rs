//! `[[limits]]` over MCP: calls, reads and searches over a rate or a quota are refused with the
//! limit's name and when to retry, one principal's use never spends another's, a session and a
//! caller without one spend the same budget, and replicas sharing Redis share one quota exactly.

use rmcp::model::ReadResourceRequestParams;
use serde_json::{Value, json};
use toolmux::app::EmbedderChoice;

use crate::harness::*;
use crate::redis_server::Redis;

/// A gateway in `mode` over the echo demo backend, bearer tokens for alice, bob and carol (an
/// admin), a policy that lets them use it, and `limits`.
fn config(mode: &str, echo: &str, limits: &str) -> String {
    let auth = bearer_auth(&["alice", "bob", "carol"])
        .replace("mode = \"bearer\"\n", "mode = \"bearer\"\nadmins = [\"carol\"]\n");
    format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"{mode}\"\n{}{auth}{limits}", http_backend_toml("echo", echo))
}

async fn read_about(c: &Client) -> Result<rmcp::model::ReadResourceResult, rmcp::ServiceError> {
    c.read_resource(ReadResourceRequestParams::new("demo://echo/about")).await
}

async fn find_echo(c: &Client) -> rmcp::model::CallToolResult {
    call(c, "find_tool", json!({"tool_description": "echo text back"})).await
}

async fn call_echo(c: &Client, input: &str) -> rmcp::model::CallToolResult {
    call(c, "call_tool", json!({"tool_name": "echo_echo", "parameters": {"input": input}})).await
}

async fn metrics(app: &toolmux::app::App) -> String {
    reqwest::get(format!("http://{}/metrics", app.addr.unwrap())).await.unwrap().text().await.unwrap()
}

/// The value of the series `name{labels}` in a `/metrics` text (0 when absent).
fn series(text: &str, name_and_labels: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

/// Passthrough: alice's calls and resource reads spend her quota until both are refused (an
/// `isError` result, and JSON-RPC error -32029 for the read); bob's budget is his own, carol is
/// not covered; alice without a session spends the same budget; `/metrics` counts by rule, and
/// the console shows each principal their own use, and an admin everyone's.
#[tokio::test]
async fn a_quota_is_each_principals_own_and_says_when_to_retry() {
    let echo = http_backend("echo").await;
    let rule =
        "[[limits]]\nname = \"agents\"\nprincipals = [\"alice\", \"bob\"]\nbackends = [\"echo\"]\ncalls_per_hour = 3\n";
    let app = gateway(&config("passthrough", &echo.url, rule), EmbedderChoice::None).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let (carol, _) = client_with_auth(&app, Some("carol")).await;

    for i in 0..2 {
        let r = call(&alice, "echo_echo", json!({"input": format!("a{i}")})).await;
        assert_eq!((r.is_error, text(&r)), (Some(false), format!("a{i}")));
    }
    read_about(&alice).await.expect("a read is allowed within the quota (and spends it)");
    let refused = call(&alice, "echo_echo", json!({"input": "over"})).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let why = text(&refused);
    assert!(
        why.contains("`agents`") && why.contains("calls_per_hour = 3 per hour") && why.contains("try again in"),
        "{why}"
    );
    let secs: u64 = why.split("try again in ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
    assert!((1..=3600).contains(&secs), "{why}");
    let err = read_about(&alice).await.expect_err("a read over the quota is refused");
    let rmcp::ServiceError::McpError(err) = err else { panic!("a JSON-RPC error: {err:?}") };
    assert_eq!(err.code.0, -32029, "{err:?}");
    assert_eq!(err.data.as_ref().unwrap()["limit"], "agents");
    assert!(err.data.as_ref().unwrap()["retryAfter"].as_u64().unwrap() >= 1);

    // The same principal without a session: the same budget, already spent.
    let stateless = stateless_client(&app, Recorder::default(), Some("alice")).await;
    let r = call(&stateless, "echo_echo", json!({"input": "x"})).await;
    assert_eq!(r.is_error, Some(true), "alice without a session is refused too: {r:?}");
    assert!(text(&r).contains("`agents`"));

    // bob spends his own budget; carol is not covered by the rule.
    for i in 0..3 {
        let r = call(&bob, "echo_echo", json!({"input": format!("b{i}")})).await;
        assert_eq!(text(&r), format!("b{i}"), "alice's use spent none of bob's quota");
    }
    assert_eq!(call(&bob, "echo_echo", json!({"input": "over"})).await.is_error, Some(true));
    for i in 0..6 {
        assert_eq!(text(&call(&carol, "echo_echo", json!({"input": format!("c{i}")})).await), format!("c{i}"));
    }

    let m = metrics(&app).await;
    assert_eq!(series(&m, "toolmux_limit_refusals_total{rule=\"agents\",limit=\"calls_per_hour\"}"), 4, "{m}");
    assert_eq!(series(&m, "toolmux_tool_calls_total{backend=\"echo\",outcome=\"limited\"}"), 3, "{m}");

    let overview = |token: &'static str| {
        let url = format!("http://{}/ui/api/overview", app.addr.unwrap());
        async move {
            reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap().json::<Value>().await.unwrap()
        }
    };
    let rows = |v: &Value| -> Vec<(String, String, u64, u64)> {
        v["limits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| {
                let s = |k: &str| u[k].as_str().unwrap().to_string();
                (s("principal"), s("limit"), u["used"].as_u64().unwrap(), u["allowed"].as_u64().unwrap())
            })
            .collect()
    };
    let mine = rows(&overview("alice").await);
    assert_eq!(mine, [("alice".to_string(), "calls_per_hour".to_string(), 3, 3)], "alice sees her own use only");
    let mut all = rows(&overview("carol").await);
    all.sort();
    assert_eq!(all.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["alice", "bob"], "the admin sees everyone's");
    app.shutdown().await;
}

/// Optimizer: find_tool has its own rate (a search over it never reaches the model), call_tool
/// is refused by a rate with the seconds until the next token, and a result-token quota stops
/// the call after the one that crossed it.
#[tokio::test]
async fn find_tool_call_tool_and_result_tokens_have_their_limits() {
    let echo = http_backend("echo").await;
    let rules = "[[limits]]\nname = \"search\"\nprincipals = [\"*\"]\nfind_tool_rate = \"2/min\"\n\
                 [[limits]]\nname = \"calls\"\nprincipals = [\"alice\"]\nrate = \"1/min\"\n\
                 [[limits]]\nname = \"tokens\"\nprincipals = [\"bob\"]\nresult_tokens_per_day = 5\n";
    let app = gateway(&config("optimizer", &echo.url, rules), EmbedderChoice::None).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;

    for _ in 0..2 {
        let r = find_echo(&alice).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
        assert!(found(&r).contains(&"echo_echo".to_string()));
    }
    let r = find_echo(&alice).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("find_tool refused: limit `search` (find_tool_rate = 2/min)"), "{}", text(&r));
    assert!(text(&r).contains("try again in 30 s"), "one search comes back every 30 s: {}", text(&r));
    assert_ne!(find_echo(&bob).await.is_error, Some(true), "bob's searches are his own");

    assert_eq!(text(&call_echo(&alice, "one").await), "one");
    let r = call_echo(&alice, "two").await;
    assert_eq!(r.is_error, Some(true));
    assert!(
        text(&r).contains("limit `calls` (rate = 1/min)") && text(&r).contains("try again in 60 s"),
        "{}",
        text(&r)
    );

    // bob's first result (more than 5 tokens) is returned whole; it used his quota up.
    assert_eq!(text(&call_echo(&bob, "a result longer than twenty bytes").await), "a result longer than twenty bytes");
    let r = call_echo(&bob, "again").await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("limit `tokens` (result_tokens_per_day = 5 per day)"), "{}", text(&r));
    app.shutdown().await;
}

/// A reload puts new limits in force at once and says so.
#[tokio::test]
async fn a_reload_changes_the_limits_in_force() {
    let echo = http_backend("echo").await;
    let app = gateway(&config("passthrough", &echo.url, ""), EmbedderChoice::None).await;
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    for _ in 0..3 {
        assert_eq!(text(&call(&alice, "echo_echo", json!({"input": "x"})).await), "x");
    }
    let rule = "[[limits]]\nprincipals = [\"alice\"]\ncalls_per_hour = 1\n";
    let done = app.reload(toolmux::config::Config::parse(&config("passthrough", &echo.url, rule)).unwrap()).await;
    assert!(done.limits && done.to_string().contains("limits changed"), "{done}");
    assert_eq!(text(&call(&alice, "echo_echo", json!({"input": "y"})).await), "y");
    let r = call(&alice, "echo_echo", json!({"input": "z"})).await;
    assert!(r.is_error == Some(true) && text(&r).contains("`limits[0]`"), "{r:?}");
    app.shutdown().await;
}

/// Replicas sharing Redis share one quota exactly: of 24 calls made at once through two
/// replicas, by two principals, exactly the quota's 7 are served. With the store gone, the
/// default keeps limiting on each replica alone (logged and counted); `refuse` refuses.
#[tokio::test]
async fn replicas_share_one_quota_exactly() {
    let mut redis = Redis::start().await;
    let echo = http_backend("echo").await;
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, redis_url: &str, extra: &str| {
        let rule = "[[limits]]\nname = \"team\"\nprincipals = [\"*\"]\nper = \"rule\"\ncalls_per_hour = 7\n";
        let toml = config("passthrough", &echo.url, rule).replace(
            "[server]\n",
            &format!(
                "[sessions]\nstore = \"redis\"\nredis_url = \"{redis_url}\"\ntimeout = \"300ms\"\n{extra}[server]\n"
            ),
        );
        let path = dir.path().join(name);
        std::fs::write(&path, toml).unwrap();
        path
    };
    let a = Served::start(&write("a.toml", &redis.url(), "")).await;
    let b = Served::start(&write("b.toml", &redis.url(), "")).await;
    let mut sessions = Vec::new();
    for (served, who) in [(&a, "alice"), (&b, "alice"), (&a, "bob"), (&b, "bob")] {
        sessions.push(RawSession::open_as(&served.url, Some(who)).await);
    }
    let calls =
        sessions.iter().flat_map(|s| (0..6).map(move |i| s.call("echo_echo", json!({"input": format!("{i}")}))));
    let results: Vec<Value> = futures::future::join_all(calls).await;
    let served = results.iter().filter(|r| r["isError"] != true).count();
    let refused: Vec<&Value> = results.iter().filter(|r| r["isError"] == true).collect();
    assert_eq!(served, 7, "exactly the quota is served across both replicas");
    assert_eq!(refused.len(), 24 - 7);
    assert!(refused.iter().all(|r| r["content"][0]["text"].as_str().unwrap().contains("`team`")), "{refused:?}");

    // The store goes away: each replica counts alone (its own book is empty, so it serves),
    // and says so in its metrics.
    redis.kill().await;
    let r = sessions[0].call("echo_echo", json!({"input": "alone"})).await;
    assert_eq!(r["content"][0]["text"], "alone", "{r}");
    let m = a.get("/metrics").await.1;
    assert!(series(&m, "toolmux_limit_store_unreachable_total{action=\"local\"}") >= 1, "{m}");

    let strict = Served::start(&write("strict.toml", &redis.url(), "limits_when_unreachable = \"refuse\"\n")).await;
    let s = RawSession::open_as(&strict.url, Some("carol")).await;
    let r = s.call("echo_echo", json!({"input": "x"})).await;
    assert_eq!(r["isError"], true, "{r}");
    assert!(r["content"][0]["text"].as_str().unwrap().contains("limits store does not answer"), "{r}");
}
