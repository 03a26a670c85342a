use super::*;

const FULL: &str = r#"
[server]
listen = "127.0.0.1:0"
path = "/mcp"
mode = "passthrough"

[[backends]]
name = "github"
url = "http://127.0.0.1:9001/mcp"
timeout = "5s"

[[backends]]
name = "time"
command = "uvx"
args = ["mcp-server-time"]

[aggregation]
conflict_resolution = "prefix"
prefix_format = "{backend}_"

[[aggregation.tools]]
backend = "github"
filter = ["create_issue"]
overrides = { create_issue = { name = "new_issue", description = "Open an issue" } }

[optimizer]
max_tools_to_return = 8
"#;

#[test]
fn full_example_parses() {
    let c = Config::parse(FULL).unwrap();
    assert_eq!(c.server.mode, Mode::Passthrough);
    assert_eq!(c.server.listen.port(), 0);
    assert_eq!(c.backends.len(), 2);
    assert_eq!(c.backends[0].timeout, Duration::from_secs(5));
    assert_eq!(c.backends[1].timeout, Duration::from_secs(30));
    assert!(matches!(&c.backends[1].transport, Transport::Stdio { command, .. } if command == "uvx"));
    let gh = &c.aggregation.per_backend["github"];
    assert_eq!(gh.filter.as_deref(), Some(&["create_issue".to_string()][..]));
    assert_eq!(gh.overrides["create_issue"].name.as_deref(), Some("new_issue"));
    assert_eq!(c.optimizer.max_tools_to_return, 8);
    assert_eq!(c.server.max_body, DEFAULT_MAX_BODY);
}

#[test]
fn defaults_match_the_reference() {
    let c = Config::parse("").unwrap();
    assert_eq!(c.server.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(c.server.path, "/mcp");
    assert_eq!(c.server.mode, Mode::Optimizer);
    assert_eq!(c.optimizer.max_tools_to_return, 8);
    assert_eq!(c.health.interval, Duration::from_secs(30));
    assert_eq!(c.health.timeout, Duration::from_secs(10));
    assert_eq!(c.health.unhealthy_threshold, 3);
    assert!(c.health.circuit_breaker.is_none());
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let err = Config::parse("[server]\nlisten = \"127.0.0.1:1\"\nmood = \"x\"\n").unwrap_err();
    let p = &err.problems[0];
    assert_eq!(p.line, Some(3), "{err}");
    assert!(p.message.contains("mood"), "{err}");
    assert_eq!(p.key, "mood");
}

#[test]
fn every_semantic_problem_is_reported_with_key_and_line() {
    let text = r#"
[server]
mode = "fast"

[[backends]]
name = "Bad Name"
url = "ftp://x"

[[backends]]
name = "ok"
command = "x"
timeout = "soon"

[optimizer]
max_tools_to_return = 51
"#;
    let err = Config::parse(text).unwrap_err();
    let keys: Vec<(&str, Option<usize>)> = err.problems.iter().map(|p| (p.key.as_str(), p.line)).collect();
    assert!(keys.contains(&("server.mode", Some(3))), "{err}");
    assert!(keys.contains(&("backends[0].name", Some(6))), "{err}");
    assert!(keys.contains(&("backends[0].url", Some(7))), "{err}");
    assert!(keys.contains(&("backends[1].timeout", Some(12))), "{err}");
    assert!(keys.contains(&("optimizer.max_tools_to_return", Some(15))), "{err}");
    assert!(err.to_string().contains("5 problems"), "{err}");
}

#[test]
fn duplicate_backend_and_unknown_aggregation_backend() {
    let text = "[[backends]]\nname = \"a\"\nurl = \"http://x\"\n[[backends]]\nname = \"a\"\nurl = \"http://y\"\n[[aggregation.tools]]\nbackend = \"nope\"\n";
    let err = Config::parse(text).unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[1].name" && p.line == Some(5)), "{err}");
    assert!(err.problems.iter().any(|p| p.key == "aggregation.tools[0].backend"), "{err}");
}

#[test]
fn header_env_expansion() {
    // SAFETY: tests in this module do not read this variable concurrently.
    unsafe { std::env::set_var("TOOLMUX_TEST_TOKEN", "s3cret") };
    let c = Config::parse(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nheaders = { Authorization = \"Bearer ${TOOLMUX_TEST_TOKEN}\" }\n",
    )
    .unwrap();
    let Transport::Http { headers, .. } = &c.backends[0].transport else { panic!() };
    assert_eq!(headers["Authorization"], "Bearer s3cret");
    let err = Config::parse(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nheaders = { X = \"${TOOLMUX_SURELY_UNSET_VAR}\" }\n",
    )
    .unwrap_err();
    assert!(err.problems[0].message.contains("TOOLMUX_SURELY_UNSET_VAR"), "{err}");
}

#[cfg(unix)]
#[test]
fn env_file_fills_in_what_the_environment_does_not_set() {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: tests in this module do not read this variable concurrently.
    unsafe { std::env::set_var("TOOLMUX_TEST_FROM_ENV", "from-env") };
    let dir = tempfile::tempdir().unwrap();
    let env_path = dir.path().join("secrets.env");
    std::fs::write(&env_path, "TOOLMUX_TEST_FROM_FILE=from-file\nTOOLMUX_TEST_FROM_ENV=shadowed\n").unwrap();
    std::fs::set_permissions(&env_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = dir.path().join("toolmux.toml");
    std::fs::write(
        &config,
        "env_file = \"secrets.env\"\n[[backends]]\nname = \"a\"\ncommand = \"x\"\nenv = { A = \"${TOOLMUX_TEST_FROM_FILE}\", B = \"${TOOLMUX_TEST_FROM_ENV}\" }\n",
    )
    .unwrap();
    let c = Config::load(&config).unwrap();
    let Transport::Stdio { env, .. } = &c.backends[0].transport else { panic!() };
    assert_eq!(env["A"], "from-file");
    assert_eq!(env["B"], "from-env");

    std::fs::set_permissions(&env_path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let err = Config::load(&config).unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "env_file" && p.message.contains("chmod 600")), "{err}");
    std::fs::remove_file(&env_path).unwrap();
    let err = Config::load(&config).unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "env_file" && p.message.contains("cannot read")), "{err}");
}

#[test]
fn sessions_default_to_memory_and_redis_needs_an_address() {
    assert_eq!(Config::parse("").unwrap().sessions.store, SessionStore::Memory);
    let c = Config::parse("[sessions]\nstore = \"redis\"\nredis_url = \"rediss://user:pw@cache.internal:6380/2\"\n")
        .unwrap();
    let SessionStore::Redis(r) = c.sessions.store else { panic!("redis store") };
    assert_eq!(r.url, "rediss://user:pw@cache.internal:6380/2");
    assert_eq!(r.key_prefix, "toolmux:");
    assert_eq!(r.timeout, Duration::from_millis(500));

    let e = Config::parse("[sessions]\nstore = \"redis\"\n").unwrap_err();
    assert_eq!(e.problems[0].key, "sessions.redis_url");
    let e = Config::parse("[sessions]\nstore = \"redis\"\nredis_url = \"http://x\"\ntimeout = \"0s\"\n").unwrap_err();
    let keys: Vec<_> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["sessions.redis_url", "sessions.timeout"]);
    let e = Config::parse("[sessions]\nstore = \"disk\"\n").unwrap_err();
    assert!(e.problems[0].message.contains("\"memory\", \"redis\""), "{e}");
    let e = Config::parse("[sessions]\nredis_url = \"redis://x\"\n").unwrap_err();
    assert_eq!(e.problems[0].key, "sessions.store");
    let e =
        Config::parse("[sessions]\nstore = \"redis\"\nredis_url = \"redis://x\"\ntls_ca_file = \"/no/such/ca.pem\"\n")
            .unwrap_err();
    let messages: Vec<_> = e.problems.iter().map(|p| (p.key.as_str(), p.message.as_str())).collect();
    assert_eq!(messages.len(), 2, "{e}");
    assert!(messages[0].1.contains("rediss://") && messages[1].1.contains("cannot read /no/such/ca.pem"), "{e}");
    // A password in the URL is never repeated in an error.
    let e = Config::parse("[sessions]\nstore = \"redis\"\nredis_url = \"redis://:hunter2@\"\n").unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[test]
fn admins_are_names_or_groups_and_everyone_without_authentication() {
    let tokens = "[[auth.tokens]]\nprincipal = \"a\"\nsha256 = \"0000000000000000000000000000000000000000000000000000000000000000\"\n";
    let c =
        Config::parse(&format!("[auth]\nmode = \"bearer\"\nadmins = [\"alice\", \"group:ops\"]\n{tokens}")).unwrap();
    assert!(c.auth.is_admin("alice", &[]));
    assert!(c.auth.is_admin("bob", &["ops".to_string()]));
    assert!(!c.auth.is_admin("bob", &["dev".to_string()]));
    assert!(!c.auth.is_admin("group:ops", &[]), "a group is not a principal");
    assert!(Config::parse("").unwrap().auth.is_admin("anonymous", &[]), "no authentication: one trusted user");
    let e = Config::parse(&format!("[auth]\nmode = \"bearer\"\nadmins = [\"\", \"group:\"]\n{tokens}")).unwrap_err();
    let keys: Vec<_> = e.problems.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["auth.admins[0]", "auth.admins[1]"], "{e}");
}

#[test]
fn oauth_backends_are_http_and_carry_no_authorization_header() {
    let c = Config::parse(
        "[[backends]]\nname = \"a\"\nurl = \"https://x/mcp\"\nauth = \"oauth\"\n[backends.oauth]\nclient_id = \"id\"\nscopes = [\"read\"]\nredirect_port = 8765\n",
    )
    .unwrap();
    let o = c.backends[0].oauth.as_ref().unwrap();
    assert_eq!(
        (o.client_id.as_deref(), o.scopes.as_slice(), o.redirect_port),
        (Some("id"), &["read".to_string()][..], 8765)
    );
    assert!(c.backends[0].token_exchange.is_none());
    let err = Config::parse("[[backends]]\nname = \"a\"\ncommand = \"x\"\nauth = \"oauth\"\n").unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].auth" && p.message.contains("HTTP")), "{err}");
    let err = Config::parse(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nauth = \"oauth\"\nheaders = { Authorization = \"Bearer x\" }\n",
    )
    .unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].headers.Authorization"), "{err}");
    let err = Config::parse("[[backends]]\nname = \"a\"\nurl = \"http://x\"\n[backends.oauth]\nclient_id = \"id\"\n")
        .unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].oauth"), "{err}");
    let err = Config::parse(
        "[[backends]]\nname = \"a\"\nurl = \"http://x\"\nauth = \"oauth\"\n[backends.oauth]\nclient_secret = \"s\"\nclient_metadata_url = \"http://x/\"\n",
    )
    .unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].oauth.client_secret"), "{err}");
    assert!(err.problems.iter().any(|p| p.key == "backends[0].oauth.client_metadata_url"), "{err}");
}

#[test]
fn sse_is_a_transport_for_url_backends() {
    let c = Config::parse("[[backends]]\nname = \"a\"\nurl = \"http://x/sse\"\ntransport = \"sse\"\n").unwrap();
    assert!(matches!(c.backends[0].transport, Transport::Http { sse: true, .. }));
    let err = Config::parse("[[backends]]\nname = \"a\"\nurl = \"http://x\"\ntransport = \"websocket\"\n").unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].transport"), "{err}");
    let err = Config::parse("[[backends]]\nname = \"a\"\ncommand = \"x\"\ntransport = \"sse\"\n").unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].transport"), "{err}");
}

#[test]
fn precision_defaults_to_what_this_cpu_runs_best_and_names_its_key() {
    let auto = Config::parse("").unwrap().optimizer.precision;
    assert_eq!(auto, Config::parse("[optimizer]\nprecision = \"auto\"\n").unwrap().optimizer.precision);
    // int8 exactly where this CPU's kernel was measured faster than f32.
    let kernel = crate::simd::int8::choice().kernel;
    assert_eq!(auto, if kernel.beats_f32() { Precision::Int8(kernel) } else { Precision::F32 });
    assert_eq!(Config::parse("[optimizer]\nprecision = \"f32\"\n").unwrap().optimizer.precision, Precision::F32);
    assert_eq!(
        Config::parse("[optimizer]\nprecision = \"int8\"\n").unwrap().optimizer.precision,
        Precision::Int8(kernel)
    );
    let err = Config::parse("[optimizer]\nprecision = \"fp16\"\n").unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "optimizer.precision" && p.message.contains("auto")), "{err}");
}

#[test]
fn the_console_is_on_by_default_and_keeps_its_path() {
    assert!(Config::parse("").unwrap().server.console);
    assert!(!Config::parse("[server]\nconsole = false\n").unwrap().server.console);
    let err = Config::parse("[server]\npath = \"/ui\"\n").unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "server.path" && p.message.contains("console")), "{err}");
    assert_eq!(Config::parse("[server]\npath = \"/ui\"\nconsole = false\n").unwrap().server.path, "/ui");
}

#[test]
fn scrubbing_is_on_by_default_and_a_backend_may_differ() {
    let c = Config::parse("").unwrap();
    assert!(c.scrub.on && c.scrub.backends.is_empty());
    let c = Config::parse(
        "[results]\nscrub = false\n[[backends]]\nname = \"a\"\nurl = \"http://x\"\nscrub = true\n\
         scrub_rules = { acme-key = \"ACME-[0-9A-F]{8}\" }\n",
    )
    .unwrap();
    assert!(!c.scrub.on);
    assert_eq!(c.scrub.backends["a"].on, Some(true));
    assert_eq!(c.scrub.backends["a"].rules, [("acme-key".to_string(), "ACME-[0-9A-F]{8}".to_string())]);
    let err =
        Config::parse("[[backends]]\nname = \"a\"\nurl = \"http://x\"\nscrub_rules = { bad = \"(\" }\n").unwrap_err();
    assert!(
        err.problems.iter().any(|p| p.key == "backends[0].scrub_rules.bad" && p.message.contains("regular")),
        "{err}"
    );
    let err = Config::parse("[[backends]]\nname = \"a\"\nurl = \"http://x\"\nscrub_rules = { \"Bad Name\" = \"x\" }\n")
        .unwrap_err();
    assert!(
        err.problems.iter().any(|p| p.key.starts_with("backends[0].scrub_rules.") && p.message.contains("[a-z0-9-]")),
        "{err}"
    );
    let err =
        Config::parse("[[backends]]\nname = \"a\"\nurl = \"http://x\"\nscrub = false\nscrub_rules = { k = \"x\" }\n")
            .unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "backends[0].scrub_rules"), "{err}");
}

#[test]
fn result_limits_default_to_claude_codes_and_are_set_per_backend_tool_and_rule() {
    let c = Config::parse("").unwrap();
    assert_eq!((c.results.max_tokens, c.results.max_bytes), (25_000, 1 << 20));
    assert_eq!(c.results.keep_for, std::time::Duration::from_secs(600));
    let c = Config::parse(
        "[results]\nmax_tokens = 1000\nkeep_for = \"2m\"\n\
         [[backends]]\nname = \"logs\"\nurl = \"http://x\"\nmax_result_tokens = 0\n\
         [[aggregation.tools]]\nbackend = \"logs\"\noverrides = { tail = { max_result_bytes = 5 } }\n\
         [[policy]]\nprincipals = [\"ci\"]\nbackends = [\"logs\"]\nmax_result_tokens = 9\n",
    )
    .unwrap();
    assert_eq!(c.results.max_tokens, 1000);
    assert_eq!(c.results.keep_for, std::time::Duration::from_secs(120));
    assert_eq!(c.results.backends["logs"], ResultLimit { tokens: Some(0), bytes: None });
    assert_eq!(c.results.tools[&("logs".to_string(), "tail".to_string())].bytes, Some(5));
    assert_eq!(c.results.rules.len(), 1);
    assert_eq!((c.results.rules[0].principals.clone(), c.results.rules[0].limit.tokens), (vec!["ci".into()], Some(9)));
    assert_eq!(c.policy.len(), 1, "the rule still allows");
    let err = Config::parse(
        "[results]\nmax_tokens = -1\nkeep_bytes = 10\nkeep_bytes_per_principal = 20\n\
         [[backends]]\nname = \"logs\"\nurl = \"http://x\"\nmax_result_bytes = -3\n\
         [[policy]]\nprincipals = [\"ci\"]\nbackends = [\"logs\"]\neffect = \"deny\"\nmax_result_tokens = 9\n",
    )
    .unwrap_err();
    for key in [
        "results.max_tokens",
        "results.keep_bytes_per_principal",
        "backends[0].max_result_bytes",
        "policy[0].max_result_tokens",
    ] {
        assert!(err.problems.iter().any(|p| p.key == key), "{key}: {err}");
    }
}

/// A rule's backend without a wildcard names one backend, which must be configured; an escaped
/// character (`git\hub`) is still that one name.
#[test]
fn a_rules_plain_backend_must_be_configured_escapes_read_as_the_character() {
    let rule = |backend: &str| format!("{FULL}[[policy]]\nprincipals = [\"*\"]\nbackends = [{backend:?}]\n");
    for fine in ["github", "git\\hub", "git*", "{github,time}"] {
        assert!(Config::parse(&rule(fine)).is_ok(), "{fine}");
    }
    for unknown in ["gitlab", "git\\lab"] {
        let err = Config::parse(&rule(unknown)).unwrap_err().to_string();
        assert!(err.contains("policy[0].backends") && err.contains("is not a configured backend"), "{unknown}: {err}");
    }
}

#[test]
fn surfaces_are_set_globally_per_rule_and_per_client_and_named_when_wrong() {
    let c = Config::parse("").unwrap();
    assert_eq!((c.surface.default, c.surface.always_load), (SurfaceSetting::Auto, 5));
    let c = Config::parse(
        "[optimizer]\nsurface = \"tools\"\nalways_load = 3\n\
         [[optimizer.clients]]\nname = \"cursor*\"\nsurface = \"deferred\"\n\
         [[backends]]\nname = \"gh\"\nurl = \"http://x\"\n\
         [[policy]]\nprincipals = [\"ci\"]\nbackends = [\"*\"]\nsurface = \"groups\"\n",
    )
    .unwrap();
    assert_eq!((c.surface.default, c.surface.always_load), (SurfaceSetting::Tools, 3));
    assert_eq!(c.surface.clients, [ClientSurface { name: "cursor*".into(), surface: SurfaceSetting::Deferred }]);
    assert_eq!(
        (c.surface.rules[0].principals.clone(), c.surface.rules[0].surface),
        (vec!["ci".into()], SurfaceSetting::Groups)
    );
    assert_eq!(c.policy.len(), 1, "the rule still allows");
    let err = Config::parse(
        "[optimizer]\nsurface = \"lazy\"\nalways_load = 99\n\
         [[optimizer.clients]]\nsurface = \"tools\"\n\
         [[optimizer.clients]]\nname = \"x\"\n\
         [[backends]]\nname = \"gh\"\nurl = \"http://x\"\n\
         [[policy]]\nprincipals = [\"ci\"]\nbackends = [\"*\"]\neffect = \"deny\"\nsurface = \"tools\"\n",
    )
    .unwrap_err();
    for key in [
        "optimizer.surface",
        "optimizer.always_load",
        "optimizer.clients[0].name",
        "optimizer.clients[1].surface",
        "policy[0].surface",
    ] {
        assert!(err.problems.iter().any(|p| p.key == key), "{key}: {err}");
    }
    let err = Config::parse("[server]\nmode = \"passthrough\"\n[optimizer]\nsurface = \"deferred\"\n").unwrap_err();
    assert!(err.problems.iter().any(|p| p.key == "optimizer.surface" && p.message.contains("optimizer mode")), "{err}");
}
