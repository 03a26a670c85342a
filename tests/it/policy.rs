//! A property of authorization: over random catalogs, random `[[policy]]` rules (every part of
//! the glob syntax), random callers and random backend health, nothing find_tool answers (tools,
//! `unavailable` entries, token counts) and nothing in a caller's scope reaches outside what the
//! rules allow; and, over MCP against real stdio backends, passthrough `tools/list`,
//! `resources/list` and `prompts/list` show exactly what the rules allow and `tools/call`
//! refuses the rest. The rules are checked against a plain reference reading of them (and of
//! glob syntax), not against the code under test. Each run takes a fresh seed and prints it;
//! `TOOLMUX_POLICY_SEED=N` replays one.

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

/// The run's seed: `TOOLMUX_POLICY_SEED`, else a fresh one; printed, so a failure can be replayed.
fn seeded(test: &str) -> StdRng {
    let seed = std::env::var("TOOLMUX_POLICY_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    println!("{test}: seed {seed} (TOOLMUX_POLICY_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

/// Glob syntax read plainly, as docs/configuration.md gives it for `[[policy]]`: `*` any run of
/// characters, `?` one, `[abc]` and `[a-z]` one of, `[!abc]` one not of, `{a,b}` either
/// alternative, `\x` the character x itself; anything else itself.
fn matches(pattern: &str, name: &str) -> bool {
    // Alternatives first: the pattern with each in place of the first `{…}`.
    if let Some(open) = pattern.find('{') {
        let close = open + pattern[open..].find('}').expect("a closed alternation");
        let (head, tail) = (&pattern[..open], &pattern[close + 1..]);
        return pattern[open + 1..close].split(',').any(|alt| matches(&format!("{head}{alt}{tail}"), name));
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    glob(&p, &n)
}

fn glob(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|skip| glob(&p[1..], &n[skip..])),
        Some('?') => !n.is_empty() && glob(&p[1..], &n[1..]),
        Some('\\') => n.first() == p.get(1) && glob(&p[2..], &n[1..]),
        Some('[') => {
            let close = 1 + p[1..].iter().position(|c| *c == ']').expect("a closed class");
            let (negated, class) = match p[1] {
                '!' => (true, &p[2..close]),
                _ => (false, &p[1..close]),
            };
            let Some(c) = n.first() else { return false };
            let mut inside = false;
            let mut i = 0;
            while i < class.len() {
                if class.get(i + 1) == Some(&'-') && i + 2 < class.len() {
                    inside |= (class[i]..=class[i + 2]).contains(c);
                    i += 3;
                } else {
                    inside |= class[i] == *c;
                    i += 1;
                }
            }
            inside != negated && glob(&p[close + 1..], &n[1..])
        }
        Some(c) => n.first() == Some(c) && glob(&p[1..], &n[1..]),
    }
}

/// A pattern made from one of `names`, in one of the syntax's forms; it may match that name,
/// others, or none.
fn pattern_for(rng: &mut StdRng, names: &[&str]) -> String {
    let name: Vec<char> = names[rng.random_range(0..names.len())].chars().collect();
    let other = names[rng.random_range(0..names.len())];
    let at = rng.random_range(0..name.len());
    let (head, tail): (String, String) = (name[..at].iter().collect(), name[at + 1..].iter().collect());
    let letter = |rng: &mut StdRng| char::from(b'a' + rng.random_range(0..26u8));
    match rng.random_range(0..9) {
        0 => name.iter().collect(),
        1 => "*".into(),
        2 => format!("{head}*"),
        3 => format!("*{tail}"),
        4 => format!("{head}?{tail}"),
        5 => format!("{head}[{}{}]{tail}", letter(rng), name[at]),
        6 => format!("{head}[!{}]{tail}", if rng.random_bool(0.5) { name[at] } else { letter(rng) }),
        7 => format!("{{{},{other}}}", name.iter().collect::<String>()),
        _ => match name[at] {
            'a'..='z' => format!("{head}[a-m]{tail}"),
            c => format!("{head}\\{c}{tail}"),
        },
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

/// Up to `most` patterns over `names` (a literal `*` among them now and then: a rule with one
/// allows a backend whole).
fn patterns(rng: &mut StdRng, names: &[&str], most: usize) -> Vec<String> {
    let n = rng.random_range(1..=most);
    (0..n).map(|_| if rng.random_bool(0.2) { "*".to_string() } else { pattern_for(rng, names) }).collect()
}

fn random_rule(rng: &mut StdRng, backends: &[&str]) -> PolicyRule {
    const PRINCIPALS: [&str; 4] = ["alice", "bob", "carol", "dave"];
    const GROUPS: [&str; 2] = ["dev", "ops"];
    let (principals, groups) = match rng.random_range(0..3) {
        0 => (patterns(rng, &PRINCIPALS, 2), vec![]),
        1 => (vec![], patterns(rng, &GROUPS, 1)),
        _ => (patterns(rng, &PRINCIPALS, 1), patterns(rng, &GROUPS, 1)),
    };
    PolicyRule {
        principals,
        groups,
        backends: patterns(rng, backends, 2),
        tools: patterns(rng, &TOOL_NAMES, 3),
        deny: rng.random_bool(0.3),
    }
}

#[test]
fn the_reference_reads_glob_syntax_as_documented() {
    let cases = [
        ("read_*", "read_file", true),
        ("*_file", "write_file", true),
        ("re?d_file", "read_file", true),
        ("re?d_file", "rd_file", false),
        ("[rw]ead_file", "read_file", true),
        ("[!r]ead_file", "read_file", false),
        ("[a-m]", "b", true),
        ("[a-m]", "x", false),
        ("{read,write}_file", "write_file", true),
        ("{read,write}_file", "delete_file", false),
        ("read\\_file", "read_file", true),
        ("b[0-2]", "b3", false),
        ("*", "", true),
    ];
    for (pattern, name, want) in cases {
        assert_eq!(matches(pattern, name), want, "{pattern} vs {name}");
        // globset, the matcher the gateway uses, reads them the same.
        let glob = globset::Glob::new(pattern).unwrap().compile_matcher();
        assert_eq!(glob.is_match(name), want, "globset: {pattern} vs {name}");
    }
}

#[tokio::test]
async fn nothing_reaches_outside_the_callers_policy() {
    let mut rng = seeded("nothing_reaches_outside_the_callers_policy");
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

/// The callers of the MCP walk: (principal, groups, bearer token).
const MCP_CALLERS: [(&str, &[&str], &str); 4] = [
    ("alice", &["dev"], "tok-alice"),
    ("bob", &[], "tok-bob"),
    ("carol", &["ops", "dev"], "tok-carol"),
    ("dave", &[], "tok-dave"),
];

/// `rules` as `[[policy]]` tables.
fn policy_toml(rules: &[PolicyRule]) -> String {
    rules
        .iter()
        .map(|r| {
            format!(
                "[[policy]]\nprincipals = {:?}\ngroups = {:?}\nbackends = {:?}\ntools = {:?}\neffect = \"{}\"\n",
                r.principals,
                r.groups,
                r.backends,
                r.tools,
                if r.deny { "deny" } else { "allow" }
            )
        })
        .collect()
}

/// Over MCP, as each caller with its own bearer token, against four real stdio backends (random
/// tools, a resource and a prompt each) in passthrough: after each reload to random rules,
/// `tools/list` is exactly the tools the reference allows, `resources/list` and `prompts/list`
/// exactly those of the backends it allows whole, and `tools/call` answers an allowed tool and
/// refuses one that is not.
#[tokio::test]
async fn what_passthrough_lists_and_calls_over_mcp_is_what_the_policy_allows() {
    let mut rng = seeded("what_passthrough_lists_and_calls_over_mcp_is_what_the_policy_allows");
    let dir = tempfile::tempdir().unwrap();
    let names = ["b0", "b1", "b2", "b3"];
    let mut tools_of: Vec<Vec<&str>> = Vec::new();
    let mut backends = String::new();
    for b in names {
        let mut tools: Vec<&str> = TOOL_NAMES.iter().copied().filter(|_| rng.random_bool(0.6)).collect();
        if tools.is_empty() {
            tools.push("read_file");
        }
        let listed: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t, "description": t.replace('_', " "), "inputSchema": {"type": "object"}}))
            .collect();
        let answers = [
            ("tools/list", json!({"tools": listed}).to_string()),
            ("tools/call", json!({"content": [{"type": "text", "text": "ok"}]}).to_string()),
            ("resources/list", json!({"resources": [{"uri": format!("res://{b}/doc"), "name": "doc"}]}).to_string()),
            ("prompts/list", json!({"prompts": [{"name": "brief", "description": "A brief."}]}).to_string()),
        ];
        backends +=
            &crate::harness::sh_backend_toml(dir.path(), b, r#"{"tools":{},"resources":{},"prompts":{}}"#, &answers);
        tools_of.push(tools);
    }
    let mut auth = String::from("[auth]\nmode = \"bearer\"\n");
    for (principal, groups, token) in MCP_CALLERS {
        let digest = base16ct::lower::encode_string(&<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
        auth += &format!("[[auth.tokens]]\nprincipal = \"{principal}\"\ngroups = {groups:?}\nsha256 = \"{digest}\"\n");
    }
    let toml_with = |rules: &[PolicyRule]| {
        format!("[server]\nlisten = \"127.0.0.1:0\"\nmode = \"passthrough\"\n{auth}{}{backends}", policy_toml(rules))
    };
    let first: Vec<PolicyRule> = (0..3).map(|_| random_rule(&mut rng, &names)).collect();
    let app = crate::harness::gateway(&toml_with(&first), toolmux::app::EmbedderChoice::None).await;
    // What the walk saw, so that it cannot pass by seeing nothing.
    let (mut listed_tools, mut whole, mut refused, mut answered) = (0, 0, 0, 0);
    for round in 0..20 {
        let rules: Vec<PolicyRule> = match round {
            0 => first.clone(),
            _ => (0..rng.random_range(1..=5)).map(|_| random_rule(&mut rng, &names)).collect(),
        };
        if round > 0 {
            app.reload(toolmux::config::Config::parse(&toml_with(&rules)).unwrap()).await;
        }
        for (principal, groups, token) in MCP_CALLERS {
            let caller = Caller::named(principal, groups.iter().map(|g| g.to_string()).collect());
            let (c, _) = crate::harness::client_with_auth(&app, Some(token)).await;
            let want_tools: HashSet<String> = names
                .iter()
                .zip(&tools_of)
                .flat_map(|(b, tools)| {
                    tools.iter().filter(|t| reference_allows(&rules, &caller, b, t)).map(move |t| format!("{b}_{t}"))
                })
                .collect();
            let got_tools: HashSet<String> =
                c.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
            let context = format!("round {round}, {principal} {groups:?}, rules:\n{}", policy_toml(&rules));
            assert_eq!(got_tools, want_tools, "tools/list, {context}");
            listed_tools += got_tools.len();
            let whole_backends: Vec<&str> =
                names.iter().copied().filter(|b| reference_whole(&rules, &caller, b)).collect();
            whole += whole_backends.len();
            let resources: HashSet<String> =
                c.list_all_resources().await.unwrap().into_iter().map(|r| r.uri.clone()).collect();
            let want: HashSet<String> = whole_backends.iter().map(|b| format!("res://{b}/doc")).collect();
            assert_eq!(resources, want, "resources/list, {context}");
            let prompts: HashSet<String> = c.list_all_prompts().await.unwrap().into_iter().map(|p| p.name).collect();
            let want: HashSet<String> = whole_backends.iter().map(|b| format!("{b}_brief")).collect();
            assert_eq!(prompts, want, "prompts/list, {context}");
            // One allowed tool is answered, one that is not is refused.
            let every =
                names.iter().zip(&tools_of).flat_map(|(b, tools)| tools.iter().map(move |t| format!("{b}_{t}")));
            let (allowed, denied): (Vec<String>, Vec<String>) = every.partition(|n| want_tools.contains(n));
            for (name, may) in allowed.first().map(|n| (n, true)).into_iter().chain(denied.first().map(|n| (n, false)))
            {
                let r = c.call_tool(rmcp::model::CallToolRequestParams::new(name.clone())).await;
                let ok = matches!(&r, Ok(r) if r.is_error != Some(true));
                assert_eq!(ok, may, "tools/call {name}: {r:?}, {context}");
                if may { answered += 1 } else { refused += 1 }
            }
            c.cancel().await.unwrap();
        }
    }
    app.shutdown().await;
    assert!(
        listed_tools > 40 && whole > 5 && refused > 20 && answered > 20,
        "listed {listed_tools}, whole {whole}, refused {refused}, answered {answered}"
    );
}

/// The rules, read as docs/configuration.md says resources and prompts are: a backend is the
/// caller's whole when an allowing rule for it has `tools = ["*"]` and no deny rule for the
/// caller touches it.
fn reference_whole(rules: &[PolicyRule], caller: &Caller, backend: &str) -> bool {
    let applies = |r: &PolicyRule| {
        (r.principals.iter().any(|p| matches(p, &caller.principal))
            || r.groups.iter().any(|g| caller.groups.iter().any(|cg| matches(g, cg))))
            && r.backends.iter().any(|b| matches(b, backend))
    };
    rules.iter().any(|r| !r.deny && applies(r) && r.tools.iter().any(|t| t == "*"))
        && !rules.iter().any(|r| r.deny && applies(r))
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
    toolmux::mcp::Gateway::new(toolmux::mcp::gateway::Parts::optimizer(store, upstream, health, policy))
}
