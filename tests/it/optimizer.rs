//! What optimizer mode offers an agent beyond find_tool and call_tool: pinned tools (listed and
//! called by name, under policy and as the catalog changes) and find_tool's compact answers,
//! with whole definitions on request.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use toolmux::app::EmbedderChoice;

use crate::harness::*;

fn names(tools: &[rmcp::model::Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

/// Pinned tools sit beside the meta-tools in tools/list and are called by their own names; the
/// policy still decides (bob may not use `sleep`, so it is neither listed nor callable for him);
/// a tool that comes to match a pin later reaches a connected client with tools/list_changed.
#[tokio::test]
async fn pinned_tools_are_listed_and_called_under_policy() {
    let kit = http_backend("testkit").await;
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n[health]\ninterval = \"1s\"\n\
         [optimizer]\npinned = [\"kit_echo\", \"kit_sleep\", \"kit_pin*\", \"find_tool\"]\n{}\
         [[policy]]\nprincipals = [\"*\"]\nbackends = [\"*\"]\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"kit\"]\ntools = [\"sleep\"]\neffect = \"deny\"\n{}",
        bearer_tokens(&["alice", "bob"]),
        http_backend_toml("kit", &kit.url),
    );
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (alice, alice_heard) = client_with_auth(&app, Some("alice")).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let info = alice.peer_info().unwrap();
    assert!(info.capabilities.tools.as_ref().unwrap().list_changed == Some(true), "pins can change: announced");

    assert_eq!(
        names(&alice.list_all_tools().await.unwrap()),
        ["find_tool", "call_tool", "read_result", "kit_echo", "kit_sleep"]
    );
    assert_eq!(names(&bob.list_all_tools().await.unwrap()), ["find_tool", "call_tool", "read_result", "kit_echo"]);
    assert_eq!(text(&call(&alice, "kit_echo", json!({"input": "pinned"})).await), "pinned");
    assert_eq!(text(&call(&alice, "kit_sleep", json!({"ms": 1})).await), "slept 1 ms");
    let refused = bob
        .call_tool(
            rmcp::model::CallToolRequestParams::new("kit_sleep")
                .with_arguments(json!({"ms": 1}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true));
    // Not pinned: only through call_tool.
    let unpinned = alice.call_tool(rmcp::model::CallToolRequestParams::new("kit_recall")).await.unwrap();
    assert_eq!(unpinned.is_error, Some(true), "an unpinned tool is not called by name");

    // A new backend tool that matches a pin: listed, and the client told.
    let before = alice_heard.tools_changed.load(Ordering::SeqCst);
    call(&alice, "call_tool", json!({"tool_name": "kit_add_tool", "parameters": {"name": "pin_new"}})).await;
    let told =
        eventually(Duration::from_secs(30), || async { alice_heard.tools_changed.load(Ordering::SeqCst) > before })
            .await;
    assert!(told, "tools/list_changed after a pinned tool appeared");
    assert!(names(&alice.list_all_tools().await.unwrap()).contains(&"kit_pin_new".to_string()));
}

/// A session with no pins lists exactly the two meta-tools and is never told of list changes.
#[tokio::test]
async fn without_pins_optimizer_lists_only_its_own_tools() {
    let kit = http_backend("testkit").await;
    let toml =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n{}", http_backend_toml("kit", &kit.url));
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    assert_eq!(names(&c.list_all_tools().await.unwrap()), ["find_tool", "call_tool", "read_result"]);
    // find_tool's description is written from the catalog, so the list can change.
    assert_eq!(c.peer_info().unwrap().capabilities.tools.as_ref().unwrap().list_changed, Some(true));
    // An operator's fixed description: nothing listed ever changes, and none is announced.
    let fixed = toml.replace(
        "mode = \"optimizer\"\n",
        "mode = \"optimizer\"\n[optimizer]\nfind_tool_description = \"Finds tools.\"\n",
    );
    let app = gateway(&fixed, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    assert!(c.peer_info().unwrap().capabilities.tools.as_ref().unwrap().list_changed.is_none());
}

fn found_tools(r: &rmcp::model::CallToolResult) -> Vec<Value> {
    r.structured_content.as_ref().unwrap()["tools"].as_array().unwrap().clone()
}

/// find_tool answers compactly: the first sentence of the description, the required
/// parameters whole, the optional ones by type; `describe: true` gives the whole definitions
/// (as passthrough would list them); `optimizer.answer = "full"` makes that the default.
#[tokio::test]
async fn find_tool_answers_compactly_unless_asked() {
    let kit = http_backend("testkit").await;
    for (answer, compact) in [("", true), ("[optimizer]\nanswer = \"full\"\n", false)] {
        let toml = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n{answer}{}",
            http_backend_toml("kit", &kit.url)
        );
        let app = gateway(&toml, EmbedderChoice::None).await;
        let (c, _) = client(&app).await;
        let query = json!({"tool_description": "ask the client's model a question", "tool_keywords": ["ask"]});
        let r = call(&c, "find_tool", query.clone()).await;
        let ask = found_tools(&r).into_iter().find(|t| t["name"] == "kit_ask").expect("kit_ask found");
        let schema = &ask["inputSchema"];
        assert_eq!(schema["required"], json!(["prompt"]));
        assert_eq!(schema["properties"]["prompt"]["description"], "The question");
        let mut full_query = query.clone();
        full_query["describe"] = json!(true);
        let full = call(&c, "find_tool", full_query).await;
        let full_ask = found_tools(&full).into_iter().find(|t| t["name"] == "kit_ask").unwrap();
        assert!(full_ask["inputSchema"]["properties"]["delay_ms"]["description"].is_string());
        let tokens = |r: &rmcp::model::CallToolResult| {
            r.structured_content.as_ref().unwrap()["token_metrics"]["returned_tokens"].as_u64().unwrap()
        };
        if compact {
            assert_eq!(schema["properties"]["delay_ms"], json!({"type": "integer"}), "optional: type only");
            assert!(ask["description"].as_str().unwrap().ends_with(
                "return its answer: with a request to the client (2025-11-25) or an input-required result (2026-07-28)."
            ));
            assert!(ask.get("annotations").is_none());
            assert!(tokens(&r) < tokens(&full), "the compact answer is smaller: {} vs {}", tokens(&r), tokens(&full));
        } else {
            assert_eq!(ask, full_ask, "answer = full: whole definitions by default");
        }
    }
}

/// Tokens per find_tool answer over the whole demo catalog, compact against full, for a fixed
/// set of requests: the compact answer is smaller. Prints both (docs/search.md).
#[tokio::test]
async fn compact_answers_cost_fewer_tokens_on_the_demo_catalog() {
    let mut servers = Vec::new();
    let mut toml = String::from("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n");
    for b in toolmux::demo::backends() {
        let served = http_backend(&b.name).await;
        toml += &http_backend_toml(&b.name, &served.url);
        servers.push(served);
    }
    let app = gateway(&toml, EmbedderChoice::None).await;
    let (c, _) = client(&app).await;
    let requests = [
        "create an issue in a repository",
        "search the web for a page",
        "send a message to a channel",
        "query a database table",
        "read a file from disk",
        "get the current weather for a city",
        "list open pull requests",
        "look up a package's known vulnerabilities",
        "convert currency amounts",
        "schedule a calendar event",
    ];
    let (mut compact, mut full) = (0u64, 0u64);
    for q in requests {
        let tokens = |r: rmcp::model::CallToolResult| {
            r.structured_content.unwrap()["token_metrics"]["returned_tokens"].as_u64().unwrap()
        };
        compact += tokens(call(&c, "find_tool", json!({"tool_description": q})).await);
        full += tokens(call(&c, "find_tool", json!({"tool_description": q, "describe": true})).await);
    }
    let n = requests.len() as u64;
    println!("tokens per find_tool answer over the demo catalog: compact {} full {}", compact / n, full / n);
    assert!(compact < full, "compact {compact} vs full {full}");
}

/// Token weight of every tool of the two retrieval sets' catalogs (real API schemas), compact
/// against whole: never larger for any tool. Prints the totals (docs/search.md).
#[test]
fn compact_tools_weigh_less_on_real_catalogs() {
    for set in ["toolret-apigen", "metatool"] {
        let path = format!("{}/eval/data/{set}/tools.jsonl", env!("CARGO_MANIFEST_DIR"));
        let (mut compact, mut full, mut n) = (0u64, 0u64, 0u64);
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let schema = v.get("input_schema").and_then(Value::as_object).cloned().unwrap_or_default();
            let tool = rmcp::model::Tool::new(
                v["name"].as_str().unwrap().to_string(),
                v["description"].as_str().unwrap_or_default().to_string(),
                std::sync::Arc::new(schema),
            );
            let (c, f) = (
                toolmux::catalog::token_weight(&toolmux::mcp::meta::compact(&tool)),
                toolmux::catalog::token_weight(&tool),
            );
            assert!(c <= f, "{set}: {} is heavier compact ({c} > {f})", tool.name);
            (compact, full, n) = (compact + c, full + f, n + 1);
        }
        println!(
            "{set}: {n} tools, tokens per tool compact {:.1} full {:.1}",
            compact as f64 / n as f64,
            full as f64 / n as f64
        );
        assert!(compact < full);
    }
}

/// Arguments that satisfy `schema`'s required properties, by type.
fn minimal_arguments(schema: &Value) -> Value {
    let mut args = serde_json::Map::new();
    for name in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let value = match schema["properties"][name]["type"].as_str() {
            Some("integer" | "number") => json!(1),
            Some("boolean") => json!(true),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => json!("x"),
        };
        args.insert(name.to_string(), value);
    }
    Value::Object(args)
}

/// Calls that follow a find_tool teach the ranking (real model): a tool find_tool ranked third
/// for a request rises to first once 20 principals each found it with that request and called
/// it successfully. One principal teaches a tool at most a few labels however many sessions it
/// opens (and one session one), so it cannot move the ranking for everyone; a call that ends in
/// a tool error teaches nothing; and a caller whose policy excludes the tool never gets it,
/// learned or not.
#[tokio::test]
async fn find_tool_learns_from_calls_that_follow_it() {
    let mut servers = Vec::new();
    let mut toml = String::from(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\nmax_sessions = 100\n\
         [[policy]]\nprincipals = [\"*\"]\nbackends = [\"*\"]\n",
    );
    let teachers: Vec<String> = (0..20).map(|i| format!("teacher{i}")).collect();
    let mut tokens = vec!["alice", "bob", "eve"];
    tokens.extend(teachers.iter().map(String::as_str));
    toml += &bearer_tokens(&tokens);
    for name in ["github", "jira", "monitoring"] {
        let served = http_backend(name).await;
        toml += &http_backend_toml(name, &served.url);
        servers.push(served);
    }
    let app = gateway(&toml, EmbedderChoice::Given(model())).await;
    let request = json!({"tool_description": "open a new ticket about a bug"});
    let ranked = |r: rmcp::model::CallToolResult| found(&r);
    let (first, _) = client_with_auth(&app, Some("alice")).await;
    let before = ranked(call(&first, "find_tool", request.clone()).await);
    let target = before[2].clone();
    let described =
        call(&first, "find_tool", json!({"tool_description": request["tool_description"], "describe": true})).await;
    let schema = described.structured_content.as_ref().unwrap()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == target.as_str())
        .map(|t| t["inputSchema"].clone())
        .expect("the target's whole definition");
    let good = minimal_arguments(&schema);
    println!("before: {before:?}; teaching {target} with {good}");
    let teach = |c: Client, parameters: Value| {
        let target = target.clone();
        let request = request.clone();
        async move {
            call(&c, "find_tool", request).await;
            let r = call(&c, "call_tool", json!({"tool_name": target, "parameters": parameters})).await;
            (c, r)
        }
    };
    let labels = || serde_json::to_value(app.gateway.status()).unwrap()["learning"]["labels"].as_u64().unwrap();
    // One session, twenty times: one label.
    let mut c = first;
    for _ in 0..20 {
        let (back, r) = teach(c, good.clone()).await;
        assert_ne!(r.is_error, Some(true), "{r:?}");
        c = back;
    }
    assert_eq!(labels(), 1);
    // Twenty sessions of one principal: a few labels, and the ranking does not move.
    for _ in 0..20 {
        let (s, _) = client_with_auth(&app, Some("alice")).await;
        teach(s, good.clone()).await.0.cancel().await.unwrap();
    }
    // The documented bound (docs/security.md, ARCHITECTURE.md), not whatever the constant says.
    assert_eq!(labels(), 4, "one principal's labels are bounded at 4 per tool");
    assert_eq!(ranked(call(&c, "find_tool", request.clone()).await), before, "one principal cannot move the ranking");
    let counting = || serde_json::to_value(app.gateway.status()).unwrap()["learning"]["counting"].as_u64().unwrap();
    assert_eq!(counting(), 0, "one principal's labels do not count");
    // A call that ends in a tool error teaches nothing.
    let (s, _) = client_with_auth(&app, Some("eve")).await;
    let (s, r) = teach(s, json!({})).await;
    if schema["required"].as_array().is_some_and(|r| !r.is_empty()) {
        assert_eq!(r.is_error, Some(true), "missing required arguments: {r:?}");
        assert_eq!(labels(), 4, "a failed call is no label");
    }
    s.cancel().await.unwrap();
    // Twenty principals: the tool rises.
    for t in &teachers {
        let (s, _) = client_with_auth(&app, Some(t)).await;
        teach(s, good.clone()).await.0.cancel().await.unwrap();
    }
    let status = serde_json::to_value(app.gateway.status()).unwrap();
    assert_eq!(status["learning"]["active"], true, "{}", status["learning"]);
    assert!(counting() >= 1, "the tool twenty principals labelled counts: {}", status["learning"]);
    let after = ranked(call(&c, "find_tool", request.clone()).await);
    println!("after: {after:?}");
    assert_eq!(after[0], target, "the tool twenty principals chose comes first");

    // Learned or not, a tool outside a caller's scope is never offered.
    let (backend, tool) = target.split_once('_').unwrap();
    let deny = format!(
        "[[policy]]\nprincipals = [\"bob\"]\nbackends = [\"{backend}\"]\ntools = [\"{tool}\"]\neffect = \"deny\"\n"
    );
    app.reload(toolmux::config::Config::parse(&(toml.clone() + &deny)).unwrap()).await;
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let offered = ranked(call(&bob, "find_tool", request.clone()).await);
    assert!(!offered.contains(&target), "{offered:?}");
    assert_eq!(ranked(call(&c, "find_tool", request).await)[0], target, "alice still gets it first");
}

/// A request whose words match no tool's text well is `match: none` or `weak`; once principals
/// were served by a tool after asking it (half of them in sessions, half without one), that tool
/// comes first and the answer says `good`, for callers who never taught anything, with a session
/// or without; a caller denied the tool is not told `good` about it, and a session-less call
/// follows only its own principal's find_tool.
#[tokio::test]
async fn find_tool_calls_a_match_good_once_requests_like_it_were_served() {
    let served = http_backend("monitoring").await;
    let teachers: Vec<String> = (0..20).map(|i| format!("teacher{i}")).collect();
    let mut tokens = vec!["alice", "bob", "carol", "dave"];
    tokens.extend(teachers.iter().map(String::as_str));
    let toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\nmax_sessions = 100\n{}\
         [[policy]]\nprincipals = [\"*\"]\nbackends = [\"*\"]\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"monitoring\"]\ntools = [\"list_on_call\"]\neffect = \"deny\"\n{}",
        bearer_tokens(&tokens),
        http_backend_toml("monitoring", &served.url),
    );
    let app = gateway(&toml, EmbedderChoice::Given(model())).await;
    let request = json!({"tool_description": "wake up whoever is on duty"});
    let verdict = |r: &rmcp::model::CallToolResult| r.structured_content.as_ref().unwrap()["match"].clone();
    let (alice, _) = client_with_auth(&app, Some("alice")).await;
    let before = call(&alice, "find_tool", request.clone()).await;
    println!("before: {} {:?}", verdict(&before), found(&before));
    assert_ne!(verdict(&before), "good", "the text alone does not say it fits");
    // Half the principals in sessions, half without one (2026-07-28): a session-less caller's
    // call follows its principal's last find_tool, and teaches alike.
    let serve = json!({"tool_name": "monitoring_list_on_call", "parameters": {}});
    for (i, t) in teachers.iter().enumerate() {
        let r = if i % 2 == 0 {
            let (c, _) = client_with_auth(&app, Some(t)).await;
            call(&c, "find_tool", request.clone()).await;
            let r = call(&c, "call_tool", serve.clone()).await;
            c.cancel().await.unwrap();
            r
        } else {
            let c = stateless_client(&app, Recorder::default(), Some(t)).await;
            call(&c, "find_tool", request.clone()).await;
            let r = call(&c, "call_tool", serve.clone()).await;
            c.cancel().await.unwrap();
            r
        };
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    let learned = app.gateway.store.learned().unwrap();
    let taught = learned.principals_per_tool().get("monitoring_list_on_call").copied();
    assert_eq!(taught, Some(20), "every teacher's call taught, with a session or without");
    let after = call(&alice, "find_tool", request.clone()).await;
    println!("after: {} {:?}", verdict(&after), found(&after));
    assert_eq!(found(&after)[0], "monitoring_list_on_call");
    assert_eq!(verdict(&after), "good");
    assert!(after.structured_content.as_ref().unwrap().get("note").is_none(), "a good match needs no note");
    let carol = stateless_client(&app, Recorder::default(), Some("carol")).await;
    assert_eq!(verdict(&call(&carol, "find_tool", request.clone()).await), "good", "without a session too");
    // What carol found is hers: dave's call right after it follows no find_tool of his.
    let dave = stateless_client(&app, Recorder::default(), Some("dave")).await;
    assert_ne!(call(&dave, "call_tool", serve).await.is_error, Some(true));
    assert_eq!(learned.principals_per_tool().get("monitoring_list_on_call").copied(), Some(20), "dave taught nothing");
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let denied = call(&bob, "find_tool", request).await;
    assert!(!found(&denied).contains(&"monitoring_list_on_call".to_string()));
    assert_ne!(verdict(&denied), "good", "what others were served by and bob may not use says nothing to him");
}

/// The query adapter (real model): labels of one principal alone fit nothing and move no one's
/// ranking; once tools have labels from many principals the gateway fits an adapter in the
/// background, judges it on held-back labels, says in /status and /metrics what it decided, and
/// keeps it with the learning file.
#[tokio::test]
async fn find_tool_fits_a_query_adapter_from_many_principals_labels() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("learned.json");
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\nmax_sessions = 100\n\
         [optimizer]\nlearning_file = {:?}\n\
         [[policy]]\nprincipals = [\"*\"]\nbackends = [\"*\"]\n",
        file.display().to_string()
    );
    let teachers: Vec<String> = (0..8).map(|i| format!("teacher{i}")).collect();
    let mut tokens = vec!["alice", "bob"];
    tokens.extend(teachers.iter().map(String::as_str));
    toml += &bearer_tokens(&tokens);
    let mut servers = Vec::new();
    for name in ["github", "jira", "monitoring"] {
        let served = http_backend(name).await;
        toml += &http_backend_toml(name, &served.url);
        servers.push(served);
    }
    let app = gateway(&toml, EmbedderChoice::Given(model())).await;
    // How this deployment's users ask, and the tool each request then called (find_tool's
    // second: what the plain search did not put first).
    let requests = [
        "file a bug",
        "ship the branch",
        "page whoever is on call",
        "what broke last night",
        "who owns this service",
        "open a ticket for the outage",
        "get the sprint board",
        "look at the deploy history",
    ];
    let (bob, _) = client_with_auth(&app, Some("bob")).await;
    let mut before = Vec::new();
    for r in requests {
        before.push(found(&call(&bob, "find_tool", json!({"tool_description": r})).await));
    }
    // One session labels each request's tool once.
    let teach = |principal: String| {
        let (app, before) = (&app, &before);
        async move {
            let (c, _) = client_with_auth(app, Some(&principal)).await;
            for (r, ranked) in requests.iter().zip(before) {
                let target = &ranked[1];
                let described = call(&c, "find_tool", json!({"tool_description": r, "describe": true})).await;
                let tools = described.structured_content.as_ref().unwrap()["tools"].as_array().unwrap().clone();
                let schema = tools.iter().find(|t| t["name"] == target.as_str()).map(|t| t["inputSchema"].clone());
                let parameters = minimal_arguments(&schema.unwrap_or_else(|| panic!("{target} not found for {r}")));
                let done = call(&c, "call_tool", json!({"tool_name": target, "parameters": parameters})).await;
                assert_ne!(done.is_error, Some(true), "{done:?}");
            }
            c.cancel().await.unwrap();
        }
    };
    let status = || serde_json::to_value(app.gateway.status()).unwrap()["learning"].clone();
    // Alice alone, four sessions: 32 labels, enough for the fitter to look, none that teaches.
    for _ in 0..4 {
        teach("alice".into()).await;
    }
    assert_eq!(status()["labels"], 32);
    assert!(
        eventually(Duration::from_secs(30), || async { status()["adapter"]["considered_at_labels"] == 32 }).await,
        "the fitter looked: {}",
        status()
    );
    let adapter = status()["adapter"].clone();
    assert_eq!((adapter["served"].as_bool(), adapter["last_fit"].is_null()), (Some(false), true), "{adapter}");
    for (r, was) in requests.iter().zip(&before) {
        let now = found(&call(&bob, "find_tool", json!({"tool_description": r})).await);
        assert_eq!(&now, was, "alice's labels alone change nothing for bob");
    }
    // Eight more principals: every tool now has labels from nine.
    for t in &teachers {
        teach(t.clone()).await;
    }
    assert!(
        eventually(Duration::from_secs(60), || async { !status()["adapter"]["last_fit"].is_null() }).await,
        "fitted: {}",
        status()
    );
    let adapter = status()["adapter"].clone();
    println!("{adapter:#}");
    let fit = &adapter["last_fit"];
    let (fitted, held_out) = (fit["fitted"].as_u64().unwrap(), fit["held_out"].as_u64().unwrap());
    assert!(held_out > 0 && fitted >= 40, "{fit}");
    let served = fit["margin"].as_f64().unwrap() >= adapter["required_margin"].as_f64().unwrap();
    assert_eq!(adapter["served"], served, "served exactly when the margin is reached: {adapter}");
    let metrics = app.gateway.render_metrics();
    assert!(metrics.contains(&format!("toolmux_adapter_served {}", u8::from(served))), "{metrics}");
    assert!(metrics.contains(&format!("toolmux_adapter_fit_labels {fitted}")), "{metrics}");
    // Kept with the learning file, and read back as it was decided.
    app.stop(Duration::from_secs(5)).await;
    let back = toolmux::store::learned::Learned::open(true, 384, Some(file));
    let (judged, _) = back.last_fit().expect("the fit was saved");
    assert_eq!((judged.fitted as u64, judged.held_out as u64), (fitted, held_out));
    assert_eq!(back.served().is_some(), served);
}

/// find_tool's description says what is behind it for each caller: the backends in their scope
/// and what their tools act on. Bob, who may not use `code`, is not told of it; a backend added
/// by a reload reaches a connected client's stream as `tools/list_changed`, and its next
/// tools/list names it. The operator's own description wins for everyone.
#[tokio::test]
async fn find_tool_says_what_is_behind_it_for_each_caller() {
    let dir = tempfile::tempdir().unwrap();
    let listing = |names: &[&str]| {
        let tools: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "description": "A tool.", "inputSchema": {"type": "object"}}))
            .collect();
        vec![("tools/list", json!({ "tools": tools }).to_string())]
    };
    let code = sh_backend_toml(
        dir.path(),
        "code",
        r#"{"tools":{}}"#,
        &listing(&["create_pull_request", "merge_pull_request", "list_issues"]),
    );
    let weather = sh_backend_toml(dir.path(), "weather", r#"{"tools":{}}"#, &listing(&["get_forecast"]));
    let calendar = sh_backend_toml(dir.path(), "calendar", r#"{"tools":{}}"#, &listing(&["createEvent"]));
    let head = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmode = \"optimizer\"\n[health]\ninterval = \"1s\"\n{}\
         [[policy]]\nprincipals = [\"*\"]\nbackends = [\"*\"]\n\
         [[policy]]\nprincipals = [\"bob\"]\nbackends = [\"code\"]\neffect = \"deny\"\n",
        bearer_tokens(&["alice", "bob"]),
    );
    let app = gateway(&format!("{head}{code}{weather}"), EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    let alice = RawSession::open_as(&url, Some("alice")).await;
    let bob = RawSession::open_as(&url, Some("bob")).await;
    let for_alice = described(&alice).await;
    assert!(
        for_alice.ends_with("Behind it: code (3 tools: pull request, issue), weather (1 tool: forecast)."),
        "{for_alice}"
    );
    let for_bob = described(&bob).await;
    assert!(for_bob.ends_with("Behind it: weather (1 tool: forecast)."), "{for_bob}");

    // A backend added by a reload: alice is told on her stream and reads it on her next list.
    let mut events = alice.listen().await;
    app.reload(toolmux::config::Config::parse(&format!("{head}{code}{weather}{calendar}")).unwrap()).await;
    let list_changed = "notifications/tools/list_changed";
    assert!(
        told(&mut events, list_changed, Duration::from_secs(20)).await,
        "tools/list_changed reaches alice's stream"
    );
    let for_alice = described(&alice).await;
    assert!(for_alice.contains("calendar (1 tool: event)"), "{for_alice}");
    assert!(!described(&bob).await.contains("code ("), "bob is still not told of code");

    // The operator's description, for everyone.
    let own = format!("{head}[optimizer]\nfind_tool_description = \"Search our tools.\"\n{code}{weather}");
    let app = gateway(&own, EmbedderChoice::None).await;
    let url = format!("http://{}/mcp", app.addr.unwrap());
    for who in ["alice", "bob"] {
        assert_eq!(described(&RawSession::open_as(&url, Some(who)).await).await, "Search our tools.");
    }
}

/// find_tool's description as `s` lists it.
async fn described(s: &RawSession) -> String {
    let tools = s.request("tools/list", json!({})).await;
    let find = tools["tools"].as_array().unwrap().iter().find(|t| t["name"] == "find_tool").cloned();
    find.unwrap_or_else(|| panic!("find_tool in {tools}"))["description"].as_str().unwrap().to_string()
}
