use super::*;
use crate::config::Config;

fn limiter(rules: &str) -> (Limiter, LimitCounters) {
    let config = Config::parse(&format!(
        "[[backends]]\nname = \"github\"\nurl = \"http://127.0.0.1:1/mcp\"\n[[backends]]\nname = \"slack\"\nurl = \"http://127.0.0.1:1/mcp\"\n{rules}"
    ))
    .unwrap();
    let counters = LimitCounters::default();
    (Limiter::new(&config.limits, counters.clone()), counters)
}

fn call<'a>(backend: &'a str, tool: &'a str) -> Action<'a> {
    Action::Call { backend, tool }
}

#[tokio::test]
async fn each_principal_spends_their_own_budget() {
    let (l, counters) = limiter("[[limits]]\nname = \"agents\"\ngroups = [\"agents\"]\ncalls_per_hour = 2\n");
    let a = Caller::named("a", vec!["agents".into()]);
    let b = Caller::named("b", vec!["agents".into()]);
    let c = Caller::named("c", vec![]);
    for _ in 0..2 {
        l.check(&a, call("github", "x")).await.unwrap();
    }
    let refused = l.check(&a, call("slack", "y")).await.unwrap_err();
    assert_eq!((refused.rule.as_str(), refused.limit), ("agents", Limit::CallsPerHour));
    assert!(refused.retry_secs() >= 1 && refused.retry_secs() <= 3600, "{refused:?}");
    let msg = refused.message("call of slack_y");
    assert!(
        msg.contains("`agents`") && msg.contains("calls_per_hour = 2 per hour") && msg.contains("try again in"),
        "{msg}"
    );
    // b has spent nothing; c is not covered at all.
    l.check(&b, call("github", "x")).await.unwrap();
    for _ in 0..10 {
        l.check(&c, call("github", "x")).await.unwrap();
    }
    assert_eq!(
        counters
            .refusals
            .get_or_create(&crate::metrics::RuleLimit { rule: "agents".into(), limit: "calls_per_hour" })
            .get(),
        1
    );
}

#[tokio::test]
async fn a_shared_rule_is_one_budget_for_everyone_it_matches() {
    let (l, _) = limiter("[[limits]]\nprincipals = [\"*\"]\nper = \"rule\"\nrate = \"2/min\"\n");
    l.check(&Caller::named("a", vec![]), call("github", "x")).await.unwrap();
    l.check(&Caller::named("b", vec![]), call("github", "x")).await.unwrap();
    let refused = l.check(&Caller::named("c", vec![]), call("github", "x")).await.unwrap_err();
    assert_eq!(refused.limit, Limit::Rate);
    assert_eq!(refused.retry_secs(), 30, "one token per 30 s");
}

#[tokio::test]
async fn rules_count_only_what_they_name() {
    let (l, _) = limiter(
        "[[limits]]\nname = \"gh-deletes\"\nprincipals = [\"*\"]\nbackends = [\"github\"]\ntools = [\"delete_*\"]\ncalls_per_day = 1\n\
         [[limits]]\nname = \"search\"\nprincipals = [\"*\"]\nfind_tool_rate = \"1/h\"\n",
    );
    let a = Caller::named("a", vec![]);
    l.check(&a, call("github", "delete_repo")).await.unwrap();
    assert!(l.check(&a, call("github", "delete_branch")).await.is_err());
    // Other tools, other backends, resource reads (the rule does not cover the whole backend).
    l.check(&a, call("github", "create_issue")).await.unwrap();
    l.check(&a, call("slack", "delete_message")).await.unwrap();
    l.check(&a, Action::Read { backend: "github" }).await.unwrap();
    // find_tool has its own rate, and calls do not spend it.
    l.check(&a, Action::Search).await.unwrap();
    let refused = l.check(&a, Action::Search).await.unwrap_err();
    assert_eq!((refused.rule.as_str(), refused.limit), ("search", Limit::FindToolRate));
}

#[tokio::test]
async fn a_refused_call_spends_no_other_limit() {
    let (l, _) = limiter(
        "[[limits]]\nname = \"tight\"\nprincipals = [\"a\"]\nbackends = [\"github\"]\ncalls_per_hour = 1\n\
         [[limits]]\nname = \"wide\"\nprincipals = [\"a\"]\ncalls_per_hour = 3\n",
    );
    let a = Caller::named("a", vec![]);
    l.check(&a, call("github", "x")).await.unwrap();
    for _ in 0..5 {
        assert_eq!(l.check(&a, call("github", "x")).await.unwrap_err().rule, "tight");
    }
    // `wide` was spent once: two calls elsewhere are still allowed.
    l.check(&a, call("slack", "x")).await.unwrap();
    l.check(&a, call("slack", "x")).await.unwrap();
    assert_eq!(l.check(&a, call("slack", "x")).await.unwrap_err().rule, "wide");
}

#[tokio::test]
async fn result_tokens_stop_the_next_call_and_usage_shows_them() {
    let (l, _) =
        limiter("[[limits]]\nname = \"t\"\nprincipals = [\"a\"]\nresult_tokens_per_day = 100\nrate = \"10/s\"\n");
    let a = Caller::named("a", vec![]);
    let admitted = l.check(&a, call("github", "x")).await.unwrap();
    assert!(admitted.counts_tokens());
    l.spend_tokens(admitted, 150);
    let refused = l.check(&a, call("github", "x")).await.unwrap_err();
    assert_eq!(refused.limit, Limit::TokensPerDay);
    let usage = l.usage(None).await;
    let tokens = usage.iter().find(|u| u.limit == "result_tokens_per_day").unwrap();
    assert_eq!((tokens.principal.as_str(), tokens.used, tokens.allowed), ("a", 150, 100));
    let rate = usage.iter().find(|u| u.limit == "rate").unwrap();
    assert_eq!((rate.used, rate.allowed), (1, 10));
    assert!(l.usage(Some("b")).await.is_empty(), "usage is filtered by principal");
}

#[tokio::test]
async fn new_rules_take_over_and_no_rules_cost_nothing() {
    let (l, _) = limiter("");
    assert!(!l.is_active());
    let a = Caller::named("a", vec![]);
    for _ in 0..100 {
        l.check(&a, call("github", "x")).await.unwrap();
    }
    let config = Config::parse("[[limits]]\nprincipals = [\"a\"]\ncalls_per_hour = 1\n").unwrap();
    l.set_rules(&config.limits);
    l.check(&a, call("github", "x")).await.unwrap();
    assert!(l.check(&a, call("github", "x")).await.is_err());
}
