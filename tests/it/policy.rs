//! A property of authorization: over random catalogs, random `[[policy]]` rules, random callers
//! and random backend health, nothing find_tool answers (tools, `unavailable` entries, token
//! counts) and nothing in a caller's scope (what passthrough lists, what calls resolve against,
//! the backends whose resources and prompts it gets) reaches outside what the rules allow. The rules are checked against a plain
//! reference reading of them, not against the code under test.

use std::collections::HashSet;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use toolmux::auth::policy::Rules;
use toolmux::catalog::{Catalog, Listing};
use toolmux::config::{BackendConfig, PolicyRule};
use toolmux::session::{Caller, Policy};

const TOOL_NAMES: [&str; 8] =
    ["read_file", "write_file", "delete_repo", "send_message", "read_issue", "create_issue", "run_query", "list_users"];
const QUERIES: [&str; 5] = ["read a file", "delete a repository", "send a chat message", "create an issue", "run sql"];

/// Patterns the reference below understands: `*`, `prefix*` and exact names.
fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// The rules, read plainly: some allow rule for the caller covers the tool, and no deny rule does.
fn reference_allows(rules: &[PolicyRule], caller: &Caller, backend: &str, tool: &str) -> bool {
    let covers = |r: &PolicyRule| {
        (r.principals.iter().any(|p| matches(p, &caller.principal))
            || r.groups.iter().any(|g| caller.groups.iter().any(|cg| matches(g, cg))))
            && r.backends.iter().any(|b| matches(b, backend))
            && r.tools.iter().any(|t| matches(t, tool))
    };
    rules.iter().any(|r| !r.deny && covers(r)) && !rules.iter().any(|r| r.deny && covers(r))
}

fn pick(rng: &mut StdRng, from: &[&str], most: usize) -> Vec<String> {
    let n = rng.random_range(1..=most);
    (0..n).map(|_| from[rng.random_range(0..from.len())].to_string()).collect()
}

fn random_rule(rng: &mut StdRng, backends: &[&str]) -> PolicyRule {
    let mut backend_patterns: Vec<&str> = backends.to_vec();
    backend_patterns.extend(["*", "b1*"]);
    let mut tool_patterns: Vec<&str> = TOOL_NAMES.to_vec();
    tool_patterns.extend(["*", "*", "read_*", "send_*"]);
    let (principals, groups) = match rng.random_range(0..3) {
        0 => (pick(rng, &["alice", "bob", "carol", "*"], 2), vec![]),
        1 => (vec![], pick(rng, &["dev", "ops"], 1)),
        _ => (pick(rng, &["alice", "bob"], 1), pick(rng, &["dev", "ops"], 1)),
    };
    PolicyRule {
        principals,
        groups,
        backends: pick(rng, &backend_patterns, 2),
        tools: pick(rng, &tool_patterns, 3),
        deny: rng.random_bool(0.3),
    }
}

#[tokio::test]
async fn nothing_reaches_outside_the_callers_policy() {
    let mut rng = StdRng::seed_from_u64(7);
    let callers = [
        Caller::named("alice", vec!["dev".into()]),
        Caller::named("bob", vec![]),
        Caller::named("carol", vec!["ops".into(), "dev".into()]),
        Caller::named("dave", vec![]),
    ];
    // What the run saw, so that it cannot pass by seeing nothing.
    let (mut found, mut unavailable, mut empty_scopes, mut whole_backends) = (0, 0, 0, 0);
    for round in 0..60 {
        // A catalog of 2 to 5 backends with 1 to 6 tools each.
        let names: Vec<String> = (0..rng.random_range(2..=5)).map(|i| format!("b{i}")).collect();
        let backend_names: Vec<&str> = names.iter().map(String::as_str).collect();
        let listings: Vec<Vec<rmcp::model::Tool>> = names
            .iter()
            .map(|_| {
                let mut tools: Vec<&str> = TOOL_NAMES.to_vec();
                tools.retain(|_| rng.random_bool(0.6));
                tools.truncate(6);
                if tools.is_empty() {
                    tools.push("read_file");
                }
                let schema = Arc::new(serde_json::Map::new());
                tools
                    .iter()
                    .map(|t| rmcp::model::Tool::new(t.to_string(), t.replace('_', " "), schema.clone()))
                    .collect()
            })
            .collect();
        let views: Vec<Listing<'_>> =
            names.iter().zip(&listings).map(|(n, tools)| Listing { backend: n, tools, server: None }).collect();
        let (catalog, _) = Catalog::resolve(&views, &Default::default());
        let rules: Vec<PolicyRule> =
            (0..rng.random_range(1..=5)).map(|_| random_rule(&mut rng, &backend_names)).collect();
        let down: HashSet<String> = names.iter().filter(|_| rng.random_bool(0.3)).cloned().collect();

        let policy = Arc::new(Rules::new(&rules, true));
        let gw = gateway(&names, catalog, policy.clone()).await;
        for b in &down {
            for _ in 0..3 {
                gw.health.record(b, None);
            }
        }
        let handler = toolmux::mcp::GatewayHandler::new(gw.clone());
        for caller in &callers {
            let allowed = |exposed: &str| {
                let t = gw.store.current().catalog.tools().iter().find(|t| t.name() == exposed).cloned();
                let t = t.unwrap_or_else(|| panic!("{exposed} is not in the catalog"));
                reference_allows(&rules, caller, &t.key.backend, &t.key.tool)
            };
            let snap = gw.scope_for(caller);
            // The scope is exactly the allowed tools of backends that are up.
            let want: HashSet<String> = gw
                .store
                .current()
                .catalog
                .tools()
                .iter()
                .filter(|t| !down.contains(&*t.key.backend))
                .filter(|t| reference_allows(&rules, caller, &t.key.backend, &t.key.tool))
                .map(|t| t.name().to_string())
                .collect();
            let got: HashSet<String> = snap.tools().map(|t| t.name().to_string()).collect();
            assert_eq!(got, want, "round {round}, {caller:?}, rules {rules:?}, down {down:?}");
            if got.is_empty() {
                empty_scopes += 1;
            }
            // A call resolves against the scope: every catalog name resolves exactly when allowed.
            for t in gw.store.current().catalog.tools() {
                assert_eq!(snap.tool(t.name()).is_some(), want.contains(t.name()), "round {round}: call {}", t.name());
            }
            // Resources and prompts come only from backends allowed whole: any tool name there,
            // listed or not, must be one the rules allow.
            for b in &names {
                if policy.backend(caller, b) == toolmux::session::Access::All {
                    whole_backends += 1;
                    for tool in TOOL_NAMES.iter().chain(&["not_listed_anywhere"]) {
                        assert!(
                            reference_allows(&rules, caller, b, tool),
                            "round {round}: {caller:?} gets {b}'s resources and prompts but not {tool}"
                        );
                    }
                }
            }
            let tokens: u64 = snap.tools().map(|t| t.tokens).sum();
            assert_eq!(snap.baseline_tokens, tokens, "round {round}: token baseline counts only allowed tools");
            for query in QUERIES {
                let args = json!({"tool_description": query}).as_object().cloned().unwrap();
                let (r, _) = handler.find_tool(Some(&args), &snap).await;
                let body = r.structured_content.expect("find_tool's structured answer");
                for t in body["tools"].as_array().unwrap() {
                    found += 1;
                    let name = t["name"].as_str().unwrap();
                    assert!(got.contains(name), "round {round}: {caller:?} found {name} outside its scope");
                }
                for u in body["unavailable"].as_array().map(Vec::as_slice).unwrap_or_default() {
                    unavailable += 1;
                    let name = u["name"].as_str().unwrap();
                    assert!(allowed(name), "round {round}: {caller:?} was told of {name}, which it may not use");
                    assert!(down.contains(u["backend"].as_str().unwrap()), "{u}");
                }
                assert_eq!(body["token_metrics"]["baseline_tokens"], Value::from(tokens));
            }
        }
    }
    assert!(
        found > 100 && unavailable > 20 && empty_scopes > 10 && whole_backends > 10,
        "found {found}, unavailable {unavailable}, empty {empty_scopes}, whole {whole_backends}"
    );
}

/// A gateway over `catalog` (keyword search) with `names` as backends that never connect, health
/// monitoring on, and `policy`.
async fn gateway(names: &[String], catalog: Catalog, policy: Arc<dyn Policy>) -> Arc<toolmux::mcp::Gateway> {
    let configs: Vec<BackendConfig> = names
        .iter()
        .map(|n| {
            let toml = format!("[[backends]]\nname = \"{n}\"\nurl = \"http://127.0.0.1:9/mcp\"\n");
            toolmux::config::Config::parse(&toml).unwrap().backends.remove(0)
        })
        .collect();
    let upstream =
        Arc::new(toolmux::upstream::Upstream::new(&configs, Arc::new(toolmux::upstream::NoRelay), Default::default()));
    let health = toolmux::health::Monitor::new(Default::default(), &upstream);
    for n in names {
        // A first success makes a backend healthy; three failures (below) make it unhealthy.
        health.record(n, Some(std::time::Duration::from_millis(1)));
    }
    let store = Arc::new(toolmux::store::Store::new(None, None));
    store.rebuild(catalog).await;
    toolmux::mcp::Gateway::new(toolmux::mcp::gateway::Parts {
        mode: toolmux::config::Mode::Optimizer,
        max_tools: 8,
        find_tool_description: None,
        pinned: Vec::new(),
        answer: Default::default(),
        integrity: Default::default(),
        groups: Default::default(),
        aggregation: Default::default(),
        store,
        upstream,
        health,
        policy,
        relay: toolmux::mcp::relay::Hub::new(),
        notice_window: std::time::Duration::ZERO,
        limits: Default::default(),
        max_query_chars: toolmux::config::DEFAULT_MAX_QUERY_CHARS,
        local_caller: toolmux::session::Caller::anonymous(),
        ct: tokio_util::sync::CancellationToken::new(),
    })
}
