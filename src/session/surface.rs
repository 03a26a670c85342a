//! A session's surface: what its client is shown, chosen at initialize (`mcp::surface` chooses).

/// What a session is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    Passthrough,
    Tools,
    Deferred,
    Groups,
}

impl Surface {
    pub fn name(self) -> &'static str {
        match self {
            Self::Passthrough => "passthrough",
            Self::Tools => "tools",
            Self::Deferred => "deferred",
            Self::Groups => "groups",
        }
    }

    /// Whether a backend tool may be called by its own name without being pinned: it was
    /// listed (passthrough, deferred) or handed out by a group.
    pub fn calls_by_name(self) -> bool {
        self != Self::Tools
    }

    /// Whether what the client lists can change (and `tools.listChanged` is announced): every
    /// surface that lists backend tools. `tools` lists only the meta-tools and pinned tools.
    pub fn lists_backend_tools(self) -> bool {
        self != Self::Tools
    }
}

/// A session's surface and why it was chosen, in words for `instructions`, `/status`, the
/// console and the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub surface: Surface,
    pub why: String,
}
