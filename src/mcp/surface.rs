//! What each client is shown: its surface, chosen once at initialize from the client's name and
//! capabilities, the caller, and `[optimizer] surface` (`config::surface`).
//!
//! - `passthrough`: every tool the caller may use (passthrough mode).
//! - `tools`: find_tool and call_tool, and the pinned tools (optimizer mode's own).
//! - `deferred`: every tool the caller may use, for a host that keeps tool definitions out of
//!   the model's context and searches them itself. Each carries hints that host reads: load up
//!   front (`anthropic/alwaysLoad`, for pinned tools and the caller's most used), words to search
//!   by (`anthropic/searchHint`) and the result size (`anthropic/maxResultSizeChars`, as in
//!   passthrough). find_tool and call_tool stay listed as a fallback.
//! - `groups`: each backend a group, for clients that declare `io.modelcontextprotocol/groups`.
//!
//! `auto` reads [`HOSTS`], which docs/clients.md reproduces with each entry's evidence. A
//! client that is in no entry gets `tools`, which serves any client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use globset::{GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use rmcp::model::Tool;

use crate::catalog::CatalogTool;
use crate::config::{Mode, SurfaceConfig, SurfaceSetting};
use crate::session::Caller;
pub use crate::session::surface::{Choice, Surface};

/// Principals whose tool use is counted for `always_load` (least recent out first).
const COUNTED_PRINCIPALS: usize = 4096;
/// Tools counted per principal; past it, the least used gives way.
const COUNTED_TOOLS: usize = 256;
/// Words in a search hint, at most.
const HINT_WORDS: usize = 16;

pub const ALWAYS_LOAD: &str = "anthropic/alwaysLoad";
pub const SEARCH_HINT: &str = "anthropic/searchHint";

/// One host `auto` knows, by the name it gives at initialize.
pub struct Host {
    /// A glob over `clientInfo.name`, without regard to case.
    pub name: &'static str,
    pub surface: Surface,
    /// Why this surface serves it (docs/clients.md gives the sources).
    pub evidence: &'static str,
}

/// The hosts `auto` gives another surface than `tools`. Keep docs/clients.md in step.
pub const HOSTS: &[Host] = &[
    Host {
        name: "claude-code",
        surface: Surface::Deferred,
        evidence: "Claude Code keeps MCP tool definitions out of context and searches them itself, reading \
                   anthropic/alwaysLoad and anthropic/searchHint from each tool",
    },
    Host {
        name: "Visual Studio Code*",
        surface: Surface::Deferred,
        evidence: "VS Code's agent picks the tools each turn needs from all it is given (virtual tools and \
                   embedding-guided routing)",
    },
];

/// What the client said at initialize that the choice reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Client<'a> {
    pub name: Option<&'a str>,
    /// It declared `io.modelcontextprotocol/groups`.
    pub groups: bool,
}

impl<'a> Client<'a> {
    /// From what a client sent at initialize, or with a stateless request.
    pub fn of(
        info: Option<&'a rmcp::model::Implementation>,
        capabilities: Option<&rmcp::model::ClientCapabilities>,
    ) -> Self {
        Self { name: info.map(|i| i.name.as_str()), groups: capabilities.is_some_and(crate::mcp::groups::declared) }
    }
}

/// `[optimizer] surface` compiled, and the tool use `always_load` reads.
pub struct Surfaces {
    settings: ArcSwap<Settings>,
    hosts: Vec<GlobMatcher>,
    used: Mutex<lru::LruCache<String, HashMap<String, u64>>>,
}

struct Settings {
    config: SurfaceConfig,
    clients: Vec<GlobMatcher>,
    rules: Vec<(GlobSet, GlobSet)>,
}

impl Settings {
    fn of(config: &SurfaceConfig) -> Self {
        let clients = config.clients.iter().map(|c| matcher(&c.name)).collect();
        let rules = config.rules.iter().map(|r| (set(&r.principals), set(&r.groups))).collect();
        Self { config: config.clone(), clients, rules }
    }
}

fn matcher(glob: &str) -> GlobMatcher {
    GlobBuilder::new(glob)
        .case_insensitive(true)
        .build()
        .unwrap_or_else(|_| globset::Glob::new("\u{0}").expect("a literal glob"))
        .compile_matcher()
}

fn set(globs: &[String]) -> GlobSet {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        if let Ok(g) = globset::Glob::new(g) {
            b.add(g);
        }
    }
    b.build().unwrap_or_else(|_| GlobSet::empty())
}

impl Default for Surfaces {
    fn default() -> Self {
        Self {
            settings: ArcSwap::from_pointee(Settings::of(&SurfaceConfig::default())),
            hosts: HOSTS.iter().map(|h| matcher(h.name)).collect(),
            used: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(COUNTED_PRINCIPALS).expect("a positive capacity"),
            )),
        }
    }
}

impl Surfaces {
    /// Takes `[optimizer] surface` as it is now in force (sessions opened from now on).
    pub fn set(&self, config: &SurfaceConfig) {
        self.settings.store(Arc::new(Settings::of(config)));
    }

    /// The surface for `caller` using `client`. `groups_on`: `[groups]` is enabled.
    pub fn choose(&self, mode: Mode, caller: &Caller, client: Client<'_>, groups_on: bool) -> Choice {
        let groups = groups_on && client.groups;
        let named = client.name.map_or_else(|| "a client that gave no name".to_string(), |n| format!("`{n}`"));
        if mode == Mode::Passthrough {
            return match groups {
                true => Choice { surface: Surface::Groups, why: format!("passthrough mode; {named} declared groups") },
                false => Choice { surface: Surface::Passthrough, why: "passthrough mode".into() },
            };
        }
        let settings = self.settings.load();
        let client_entry = client
            .name
            .and_then(|n| settings.clients.iter().position(|m| m.is_match(n)))
            .map(|i| (settings.config.clients[i].surface, format!("optimizer.clients[{i}] names {named}")));
        let rule = || {
            settings
                .rules
                .iter()
                .zip(&settings.config.rules)
                .find(|((principals, in_groups), _)| {
                    principals.is_match(&caller.principal) || caller.groups.iter().any(|g| in_groups.is_match(g))
                })
                .map(|(_, r)| (r.surface, format!("policy[{}] names the caller", r.index)))
        };
        let (setting, source) =
            client_entry.or_else(rule).unwrap_or_else(|| (settings.config.default, "optimizer.surface".to_string()));
        let choice = match setting {
            SurfaceSetting::Tools => Choice { surface: Surface::Tools, why: source },
            SurfaceSetting::Deferred => Choice { surface: Surface::Deferred, why: source },
            SurfaceSetting::Groups if groups => Choice { surface: Surface::Groups, why: source },
            SurfaceSetting::Groups => Choice {
                surface: Surface::Tools,
                why: format!(
                    "{source} asks for groups, but {}; find_tool and call_tool instead",
                    if groups_on {
                        format!("{named} did not declare io.modelcontextprotocol/groups")
                    } else {
                        "[groups] is off".into()
                    }
                ),
            },
            SurfaceSetting::Auto => self.auto(client, groups, &named),
        };
        Choice { why: format!("{} ({})", choice.surface.name(), choice.why), ..choice }
    }

    /// `auto`: the client's own declaration first, then [`HOSTS`].
    fn auto(&self, client: Client<'_>, groups: bool, named: &str) -> Choice {
        if groups {
            return Choice { surface: Surface::Groups, why: format!("auto: {named} declared groups") };
        }
        let host = client.name.and_then(|n| self.hosts.iter().position(|m| m.is_match(n)));
        match host.map(|i| &HOSTS[i]) {
            Some(h) => Choice { surface: h.surface, why: format!("auto: {named} — {}", h.evidence) },
            None => Choice {
                surface: Surface::Tools,
                why: format!(
                    "auto: {named} is not known to defer tools itself; find_tool and call_tool serve any client"
                ),
            },
        }
    }

    /// `principal` completed a call of `tool` (its exposed name).
    pub fn used(&self, principal: &str, tool: &str) {
        let mut used = self.used.lock().expect("used lock");
        let counts = used.get_or_insert_mut(principal.to_string(), HashMap::new);
        if !counts.contains_key(tool) && counts.len() >= COUNTED_TOOLS {
            let least = counts.iter().min_by_key(|(_, n)| **n).map(|(t, _)| t.clone());
            if let Some(least) = least {
                counts.remove(&least);
            }
        }
        *counts.entry(tool.to_string()).or_default() += 1;
    }

    /// The `always_load` tools `principal` has called most, most used first (ties by name).
    pub fn most_used(&self, principal: &str) -> Vec<String> {
        let n = self.settings.load().config.always_load;
        let mut used = self.used.lock().expect("used lock");
        let Some(counts) = used.get(principal) else { return Vec::new() };
        let mut ranked: Vec<(&String, &u64)> = counts.iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        ranked.into_iter().take(n).map(|(t, _)| t.clone()).collect()
    }
}

/// `tool` as a `deferred` client lists it: with a search hint, and marked to load up front
/// when `always` (a pinned or much used tool).
pub fn deferred(mut tool: Tool, from: &CatalogTool, always: bool) -> Tool {
    let mut meta = tool.meta.take().unwrap_or_default();
    if always {
        meta.0.insert(ALWAYS_LOAD.into(), true.into());
    }
    let hint = search_hint(from);
    if !hint.is_empty() && !meta.0.contains_key(SEARCH_HINT) {
        meta.0.insert(SEARCH_HINT.into(), hint.into());
    }
    tool.meta = Some(meta);
    tool
}

/// Words a host's own tool search can find a tool by that its name and description may not
/// hold: the words of its name, title and server as search indexes them, then its parameters',
/// each once, at most [`HINT_WORDS`].
pub fn search_hint(t: &CatalogTool) -> String {
    use crate::catalog::text::words;
    let (head, params) = t.text.split_once(" Parameters: ").unwrap_or((&t.text, ""));
    // The head is "<name words>, <title>: <description> (<server>)": the description is left
    // to the host, which reads it anyway.
    let (label, rest) = head.split_once(": ").unwrap_or((head, ""));
    let server = rest.rsplit_once(" (").map(|(_, s)| s.trim_end_matches(')')).unwrap_or("");
    let param_names = params.split(", ").map(|p| p.split_once(" (").map_or(p, |(n, _)| n));
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    // A server's label is a name as its makers write it: "GitHub" stays one word.
    let server = server.split(|c: char| !c.is_alphanumeric()).map(str::to_lowercase);
    let candidates = words(label).into_iter().chain(server).chain(param_names.flat_map(words));
    for w in candidates {
        if w.len() > 1 && seen.insert(w.clone()) {
            out.push(w);
            if out.len() == HINT_WORDS {
                break;
            }
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClientSurface, SurfaceRule};

    fn client(name: &str) -> Client<'_> {
        Client { name: Some(name), groups: false }
    }

    #[test]
    fn auto_reads_the_host_table_and_serves_the_rest_with_the_meta_tools() {
        let s = Surfaces::default();
        let anyone = Caller::anonymous();
        let chosen = |c| s.choose(Mode::Optimizer, &anyone, c, true).surface;
        assert_eq!(chosen(client("claude-code")), Surface::Deferred);
        assert_eq!(chosen(client("Visual Studio Code - Insiders")), Surface::Deferred);
        assert_eq!(chosen(client("cursor-vscode")), Surface::Tools);
        assert_eq!(chosen(Client::default()), Surface::Tools);
        assert_eq!(chosen(Client { name: Some("cursor-vscode"), groups: true }), Surface::Groups);
        // Without [groups], a client that declared them gets the meta-tools.
        assert_eq!(
            s.choose(Mode::Optimizer, &anyone, Client { name: None, groups: true }, false).surface,
            Surface::Tools
        );
        assert_eq!(s.choose(Mode::Passthrough, &anyone, client("claude-code"), true).surface, Surface::Passthrough);
        let why = s.choose(Mode::Optimizer, &anyone, client("claude-code"), true).why;
        assert!(why.starts_with("deferred (auto: `claude-code`"), "{why}");
    }

    #[test]
    fn a_client_entry_beats_a_policy_rule_which_beats_the_default() {
        let s = Surfaces::default();
        s.set(&SurfaceConfig {
            default: SurfaceSetting::Deferred,
            clients: vec![ClientSurface { name: "cursor*".into(), surface: SurfaceSetting::Tools }],
            rules: vec![SurfaceRule {
                principals: vec!["ci-*".into()],
                groups: vec![],
                surface: SurfaceSetting::Groups,
                index: 3,
            }],
            always_load: 5,
        });
        let ci = Caller::named("ci-nightly", vec![]);
        let alice = Caller::named("alice", vec![]);
        let c = s.choose(Mode::Optimizer, &ci, client("Cursor-VSCode"), true);
        assert_eq!((c.surface, c.why.as_str()), (Surface::Tools, "tools (optimizer.clients[0] names `Cursor-VSCode`)"));
        let c = s.choose(Mode::Optimizer, &ci, client("claude-code"), true);
        assert_eq!(c.surface, Surface::Tools, "groups asked for a client that did not declare them");
        assert!(c.why.contains("policy[3]") && c.why.contains("did not declare"), "{}", c.why);
        let c = s.choose(Mode::Optimizer, &ci, Client { name: Some("x"), groups: true }, true);
        assert_eq!(c.surface, Surface::Groups);
        let c = s.choose(Mode::Optimizer, &alice, client("x"), true);
        assert_eq!((c.surface, c.why.as_str()), (Surface::Deferred, "deferred (optimizer.surface)"));
    }

    #[test]
    fn most_used_is_per_principal_and_bounded() {
        let s = Surfaces::default();
        for _ in 0..3 {
            s.used("alice", "github_create_issue");
        }
        s.used("alice", "fs_read");
        s.used("bob", "fs_write");
        let mut config = SurfaceConfig { always_load: 1, ..Default::default() };
        s.set(&config);
        assert_eq!(s.most_used("alice"), ["github_create_issue"]);
        assert_eq!(s.most_used("bob"), ["fs_write"]);
        assert!(s.most_used("carol").is_empty());
        config.always_load = 0;
        s.set(&config);
        assert!(s.most_used("alice").is_empty());
        for i in 0..COUNTED_TOOLS + 10 {
            s.used("dave", &format!("t{i}"));
        }
        assert_eq!(s.used.lock().unwrap().get("dave").unwrap().len(), COUNTED_TOOLS);
    }

    #[test]
    fn a_search_hint_holds_name_server_and_parameter_words_once() {
        let tool: Tool = serde_json::from_value(serde_json::json!({
            "name": "gh_createPullRequest",
            "description": "Opens a PR.",
            "inputSchema": {"type": "object", "properties": {"base_branch": {"type": "string", "description": "into"}, "title": {"type": "string"}}}
        }))
        .unwrap();
        let text = crate::catalog::text::search_text(&tool, Some("GitHub"));
        let t = CatalogTool {
            key: crate::catalog::ToolKey { backend: "gh".into(), tool: "createPullRequest".into() },
            tool: tool.clone(),
            tokens: 0,
            text,
            digest: [0; 32],
            flags: vec![],
        };
        assert_eq!(search_hint(&t), "gh create pull request github base branch title");
        let listed = deferred(tool, &t, true);
        let meta = listed.meta.unwrap();
        assert_eq!(meta.0[ALWAYS_LOAD], true);
        assert_eq!(meta.0[SEARCH_HINT], "gh create pull request github base branch title");
    }
}
