//! The walk's steps over what a caller sees: tools, resources and prompts, groups, find_tool
//! and the operator console, each exactly the caller's scope.

use super::*;

impl Walk {
    pub(super) fn in_scope(&self, who: Who, name: &str) -> bool {
        let p = who.principal();
        let backend = name.split_once('_').map_or(name, |(b, _)| b);
        self.allowed[p].contains(backend) && !(self.no_create[p] && name.starts_with("github_create_"))
    }

    /// The backends whose resources and prompts principal `p` gets: those it may use whole.
    pub(super) fn whole(&self, p: usize) -> BTreeSet<&'static str> {
        self.allowed[p].iter().copied().filter(|b| !(*b == "github" && self.no_create[p])).collect()
    }

    /// Whether principal `p` may use `backend` (one with tools, or the one waiting for a login).
    pub(super) fn may_use(&self, p: usize, backend: &str) -> bool {
        self.allowed[p].contains(backend) || (backend == LOCKED && self.locked[p])
    }

    pub(super) async fn list(&mut self, who: Who) {
        let c = self.client(who).await;
        let tools = c.list_all_tools().await.unwrap_or_else(|e| panic!("{}: tools/list: {e}", self.at()));
        for t in tools.iter().filter(|t| !["find_tool", "call_tool", "read_result"].contains(&t.name.as_ref())) {
            assert!(self.in_scope(who, &t.name), "{}: {who:?} listed {} outside its scope", self.at(), t.name);
        }
        if self.mode == "passthrough" {
            let backends: BTreeSet<&str> =
                tools.iter().filter_map(|t| t.name.split_once('_')).map(|(b, _)| b).collect();
            let mut allowed: BTreeSet<&str> = self.allowed[who.principal()].iter().copied().collect();
            // A client of groups lists only the top-level tools: github's.
            if self.variant == Variant::StatelessWithGroups {
                allowed.retain(|b| *b == "github");
            }
            assert_eq!(backends, allowed, "{}: {who:?} lists every backend of its scope", self.at());
        }
        // In every mode, a call: answered inside the scope, refused outside it.
        let calls = [
            ("kit_echo", json!({"input": "walk"})),
            ("github_list_pull_requests", json!({"owner": "o", "repo": "r"})),
            ("github_create_issue", json!({"owner": "o", "repo": "r", "title": "walk"})),
        ];
        let (tool, args) = calls[self.rng.random_range(0..calls.len())].clone();
        let r = self.call(&c, tool, args).await;
        let answered = r.is_error != Some(true);
        assert_eq!(answered, self.in_scope(who, tool), "{}: {who:?} called {tool}: {}", self.at(), text(&r));
    }

    /// `resources/list` and `prompts/list`: exactly those of the backends the caller may use
    /// whole (each demo backend has one of each).
    pub(super) async fn parts(&mut self, who: Who) {
        let c = self.client(who).await;
        let resources = c.list_all_resources().await.unwrap_or_else(|e| panic!("{}: resources/list: {e}", self.at()));
        let of_resources: BTreeSet<String> = resources
            .iter()
            .filter(|r| r.uri.ends_with("/about"))
            .map(|r| r.uri.trim_start_matches("demo://").trim_end_matches("/about").replace("testkit", "kit"))
            .collect();
        let prompts = c.list_all_prompts().await.unwrap_or_else(|e| panic!("{}: prompts/list: {e}", self.at()));
        let of_prompts: BTreeSet<String> =
            prompts.iter().filter_map(|p| p.name.strip_suffix("_summarize")).map(str::to_owned).collect();
        let whole: BTreeSet<String> = self.whole(who.principal()).iter().map(|b| b.to_string()).collect();
        assert_eq!(of_resources, whole, "{}: {who:?}'s resources", self.at());
        assert_eq!(of_prompts, whole, "{}: {who:?}'s prompts", self.at());
    }

    /// `groups/list`: exactly the caller's backends; `groups/get` of one: its tools, all in
    /// scope, or, for a backend outside it, the same error as a group that does not exist.
    pub(super) async fn groups(&mut self, who: Who) {
        let c = self.client(who).await;
        let listed =
            custom(&c, "groups/list", json!({})).await.unwrap_or_else(|e| panic!("{}: groups/list: {e}", self.at()));
        let names: BTreeSet<String> =
            listed["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap().to_string()).collect();
        // github's tools are all top level (`[groups] top_level`): it has no group.
        let allowed: BTreeSet<String> =
            self.allowed[who.principal()].iter().filter(|b| **b != "github").map(|b| b.to_string()).collect();
        assert_eq!(names, allowed, "{}: {who:?} lists groups of its own backends only", self.at());
        let backend = BACKENDS[self.rng.random_range(0..BACKENDS.len())];
        match custom(&c, "groups/get", json!({"name": backend})).await {
            Ok(group) => {
                assert!(allowed.contains(backend), "{}: {who:?} got group {backend} outside its scope", self.at());
                for t in group["contents"]["tools"].as_array().unwrap() {
                    let name = t["name"].as_str().unwrap();
                    assert!(self.in_scope(who, name), "{}: {who:?} got {name} outside its scope", self.at());
                }
            }
            Err(ServiceError::McpError(e)) => {
                assert!(!allowed.contains(backend), "{}: {who:?} refused its own group {backend}: {e:?}", self.at());
                // Resource not found: -32002, which rmcp answers 2026-07-28 callers as -32602.
                let expected = if matches!(who, Who::Session(..)) { -32002 } else { -32602 };
                assert_eq!(e.code.0, expected, "{}: {who:?}, like a group that does not exist", self.at());
            }
            Err(e) => panic!("{}: groups/get: {e}", self.at()),
        }
    }

    pub(super) async fn find(&mut self, who: Who) {
        if self.mode != "optimizer" {
            return self.list(who).await;
        }
        // Each request with the tool it is aimed at.
        let requests = [
            ("remember a value", "kit_remember"),
            ("create an issue in a repository", "github_create_issue"),
            ("create a ticket in a tracker project", "jira_create_ticket"),
            ("list pull requests of a repository", "github_list_pull_requests"),
        ];
        let (request, aimed_at) = requests[self.rng.random_range(0..requests.len())];
        let c = self.client(who).await;
        let r = call(&*c, "find_tool", json!({"tool_description": request})).await;
        assert_ne!(r.is_error, Some(true), "{}: find_tool: {r:?}", self.at());
        let names = found(&r);
        for name in &names {
            assert!(self.in_scope(who, name), "{}: {who:?} found {name} outside its scope", self.at());
        }
        // Not an empty answer that would pass anything: the tool it asks for, when it may use it.
        assert_eq!(
            names.iter().any(|n| n == aimed_at),
            self.in_scope(who, aimed_at),
            "{}: {who:?} asked for {aimed_at}: {names:?}",
            self.at()
        );
        let sc = r.structured_content.as_ref().expect("structured content");
        let waiting: Vec<&str> = sc.get("needs_login").and_then(Value::as_array).map_or(Vec::new(), |names| {
            names.iter().map(|n| n.as_str().unwrap().split('`').nth(1).expect("a backend in backticks")).collect()
        });
        let expected: Vec<&str> = if self.locked[who.principal()] { vec![LOCKED] } else { vec![] };
        assert_eq!(waiting, expected, "{}: {who:?} told of backends waiting for a login", self.at());
    }

    /// The operator console's views, as this principal (no admin here): every tool they name is
    /// in scope, no principal but this one is shown, nothing outside the scope is listed as
    /// excluded, and another principal's scope cannot be searched.
    pub(super) async fn console(&mut self, p: usize) {
        let who = Who::Sessionless(p);
        let http = reqwest::Client::new();
        let base = format!("http://{}/ui/api", self.some_replica().1.addr.unwrap());
        let get = |path: &str| http.get(format!("{base}/{path}")).bearer_auth(PRINCIPALS[p]).send();
        let tools: Value = get("tools").await.unwrap().json().await.unwrap();
        let mut shown = BTreeSet::new();
        for backend in tools["backends"].as_array().unwrap() {
            let name = backend["name"].as_str().unwrap();
            shown.insert(name.to_string());
            let listed = backend["tools"].as_array().unwrap();
            for t in listed {
                let tool = t["name"].as_str().unwrap();
                assert!(self.in_scope(who, tool), "{}: {who:?} shown {tool} in the console", self.at());
            }
            if self.allowed[p].contains(name) {
                assert!(!listed.is_empty(), "{}: {who:?} shown {name} without its tools", self.at());
            }
        }
        let expected: BTreeSet<String> =
            BACKENDS.iter().chain(&[LOCKED]).filter(|b| self.may_use(p, b)).map(|b| b.to_string()).collect();
        assert_eq!(shown, expected, "{}: {who:?}'s backends in the console", self.at());
        assert!(tools["held"].is_number(), "{}: held details are for admins", self.at());
        let overview: Value = get("overview").await.unwrap().json().await.unwrap();
        for row in overview["principals"].as_array().unwrap() {
            assert_eq!(row["principal"], PRINCIPALS[p], "{}: {who:?} shown another principal", self.at());
        }
        for b in overview["status"]["backends"].as_array().unwrap() {
            let name = b["name"].as_str().unwrap();
            assert!(self.may_use(p, name), "{}: {who:?} shown backend {name} in the overview", self.at());
        }
        let post = |body: Value| {
            http.post(format!("{base}/search"))
                .bearer_auth(PRINCIPALS[p])
                .header("x-toolmux-console", "1")
                .json(&body)
                .send()
        };
        let searched = post(json!({"request": "create an issue"})).await.unwrap();
        assert_eq!(searched.status(), 200, "{}", self.at());
        let searched: Value = searched.json().await.unwrap();
        let ranked = searched["ranked"].as_array().unwrap();
        for hit in ranked {
            let tool = hit["name"].as_str().unwrap();
            assert!(self.in_scope(who, tool), "{}: {who:?} found {tool} in the playground", self.at());
        }
        // github and jira both have tools that create or concern issues; kit has none.
        let has_issues = self.allowed[p].contains("github") || self.allowed[p].contains("jira");
        assert!(!has_issues || !ranked.is_empty(), "{}: {who:?}'s playground search ranks nothing", self.at());
        assert!(searched.get("excluded").is_none(), "{}: excluded tools are for admins", self.at());
        let other = PRINCIPALS[(p + 1) % PRINCIPALS.len()];
        let refused = post(json!({"request": "create an issue", "principal": other})).await.unwrap();
        assert_eq!(refused.status(), 403, "{}: {who:?} searched {other}'s scope", self.at());
    }
}
