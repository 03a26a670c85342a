//! `[optimizer] surface`: what an optimizer-mode client is shown. Set for everyone
//! (`optimizer.surface`), for the callers a `[[policy]]` rule names (`surface` on the rule) and
//! for clients by the name they give at initialize (`[[optimizer.clients]]`); the most specific
//! wins (client, then rule, then the default). `auto` leaves the choice to the table of hosts in
//! [`crate::mcp::surface`].

use super::{Mode, PolicyRule, Validator, raw};

/// Tools a `deferred` client is told to load up front by default: the caller's most used.
pub const DEFAULT_ALWAYS_LOAD: usize = 5;
/// The most `optimizer.always_load` may be: beyond a handful, deferring stops paying.
pub const MAX_ALWAYS_LOAD: usize = 50;

/// One surface as the file names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SurfaceSetting {
    /// Chosen from the client's name and capabilities.
    #[default]
    Auto,
    /// find_tool and call_tool (and the pinned tools) only.
    Tools,
    /// Every tool the caller may use, listed with hints for a host that defers them itself,
    /// and find_tool and call_tool beside them.
    Deferred,
    /// Backends as groups (`io.modelcontextprotocol/groups`), for clients that declare it.
    Groups,
}

impl SurfaceSetting {
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Tools => "tools",
            Self::Deferred => "deferred",
            Self::Groups => "groups",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Self::Auto, Self::Tools, Self::Deferred, Self::Groups].into_iter().find(|s| s.name() == text)
    }
}

/// A client named at initialize, and its surface.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientSurface {
    /// A glob over `clientInfo.name`, matched without regard to case.
    pub name: String,
    pub surface: SurfaceSetting,
}

/// The callers a `[[policy]]` rule names, and their surface.
#[derive(Debug, Clone, PartialEq)]
pub struct SurfaceRule {
    pub principals: Vec<String>,
    pub groups: Vec<String>,
    pub surface: SurfaceSetting,
    /// The rule's index, for saying why a session got its surface.
    pub index: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SurfaceConfig {
    pub default: SurfaceSetting,
    /// `[[optimizer.clients]]`, in file order: the first that matches decides.
    pub clients: Vec<ClientSurface>,
    /// `[[policy]]` rules that set one, in file order: the first that names the caller decides.
    pub rules: Vec<SurfaceRule>,
    /// How many of a caller's most used tools a `deferred` client is told to load up front.
    pub always_load: usize,
}

impl Default for SurfaceConfig {
    fn default() -> Self {
        Self { default: SurfaceSetting::Auto, clients: Vec::new(), rules: Vec::new(), always_load: DEFAULT_ALWAYS_LOAD }
    }
}

/// The `surface` keys of `[[policy]]` rules, taken out of the raw file before the rules are read
/// (they are the only keys of a rule that are not about access).
pub(super) struct WrittenSurfaces(Vec<Option<String>>);

impl WrittenSurfaces {
    pub(super) fn take(raw: &mut raw::File) -> Self {
        Self(raw.policy.iter_mut().map(|r| r.surface.take()).collect())
    }
}

impl Validator<'_> {
    /// `optimizer.surface`, `optimizer.always_load`, `[[optimizer.clients]]` and the `surface`
    /// of `[[policy]]` rules (`written`), read against the validated `policy`.
    pub(super) fn surface(
        &mut self,
        raw: &mut raw::Optimizer,
        written: WrittenSurfaces,
        policy: &[PolicyRule],
        mode: Mode,
    ) -> SurfaceConfig {
        let mut out = SurfaceConfig::default();
        let mut given = Vec::new();
        if let Some(text) = raw.surface.take() {
            out.default = self.surface_setting("optimizer.surface", &text);
            given.push("optimizer.surface".to_string());
        }
        if let Some(n) = raw.always_load.take() {
            if !(0..=MAX_ALWAYS_LOAD as i64).contains(&n) {
                self.problem("optimizer.always_load", format!("{n} is out of range 0..{MAX_ALWAYS_LOAD}"));
            }
            out.always_load = n.clamp(0, MAX_ALWAYS_LOAD as i64) as usize;
        }
        for (i, c) in raw.clients.take().unwrap_or_default().into_iter().enumerate() {
            let key = format!("optimizer.clients[{i}]");
            given.push(key.clone());
            let name = match c.name {
                Some(n) if !n.trim().is_empty() => n,
                _ => {
                    self.problem(
                        format!("{key}.name"),
                        "name the client, as its clientInfo.name, e.g. \"claude-code\"",
                    );
                    continue;
                }
            };
            if let Err(e) = globset::Glob::new(&name) {
                self.problem(format!("{key}.name"), format!("`{name}` is not a glob: {}", e.kind()));
            }
            let Some(text) = c.surface else {
                self.problem(
                    format!("{key}.surface"),
                    "say which surface: \"tools\", \"deferred\", \"groups\" or \"auto\"",
                );
                continue;
            };
            let surface = self.surface_setting(&format!("{key}.surface"), &text);
            out.clients.push(ClientSurface { name, surface });
        }
        for (i, (rule, text)) in policy.iter().zip(written.0).enumerate() {
            let Some(text) = text else { continue };
            let key = format!("policy[{i}].surface");
            given.push(key.clone());
            let surface = self.surface_setting(&key, &text);
            if rule.deny {
                self.problem(key, "a deny rule grants nothing to show: set the surface on an allow rule");
                continue;
            }
            out.rules.push(SurfaceRule {
                principals: rule.principals.clone(),
                groups: rule.groups.clone(),
                surface,
                index: i,
            });
        }
        if mode == Mode::Passthrough {
            for key in given {
                self.problem(
                    key,
                    "surfaces are for optimizer mode (server.mode = \"optimizer\"); passthrough lists every tool to \
                     every client",
                );
            }
        }
        out
    }

    fn surface_setting(&mut self, key: &str, text: &str) -> SurfaceSetting {
        SurfaceSetting::parse(text).unwrap_or_else(|| {
            self.problem(
                key,
                format!("`{text}` is not a surface; use \"auto\", \"tools\", \"deferred\" or \"groups\""),
            );
            SurfaceSetting::Auto
        })
    }
}
