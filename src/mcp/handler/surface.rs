//! What each client is shown (`mcp::surface`): its `tools/list` and what `initialize` tells it.

use rmcp::model::{InitializeResult, Tool};
use rmcp::service::{RequestContext, RoleServer};

use super::GatewayHandler;
use crate::mcp::meta;
use crate::mcp::surface::{self, Choice, Surface};
use crate::session::{SessionHandle, Snapshot};

impl GatewayHandler {
    /// This request's surface: its session's, or for a client without one, chosen now.
    pub(super) fn surface(&self, ctx: &RequestContext<RoleServer>) -> Surface {
        match self.session.get() {
            Some(s) => self.gw.surface_of(s),
            None => {
                let (info, capabilities) = (ctx.client_info(), ctx.client_capabilities());
                let client = surface::Client::of(info.as_ref(), capabilities.as_ref());
                self.gw.choose_surface(&self.caller_of(ctx), client).surface
            }
        }
    }

    /// The tools a client with `surface` lists from `snap`.
    pub(super) fn listing(&self, snap: &Snapshot, surface: Surface) -> Vec<Tool> {
        let mut tools = Vec::new();
        if self.gw.mode == crate::config::Mode::Optimizer {
            tools.extend([meta::find_tool(Some(self.gw.find_tool_text(snap))), meta::call_tool()]);
            // read_result beside them, for hosts that cannot read kept results as resources.
            // Passthrough clients read kept results as resources (and may call it by name).
            if self.offers_read_result(snap) {
                tools.push(crate::results::read::tool());
            }
        }
        match (surface, self.gw.mode) {
            (Surface::Passthrough, _) => tools.extend(snap.tools().map(|t| self.served(snap, t))),
            // A client of groups lists the top-level tools; the rest come with their group.
            (Surface::Groups, crate::config::Mode::Passthrough) => {
                let top = |name: &str| self.gw.groups.as_ref().is_some_and(|g| g.is_top_level(name));
                tools.extend(snap.tools().filter(|t| top(t.name())).map(|t| self.served(snap, t)));
            }
            (Surface::Deferred, _) => {
                let often = self.gw.surfaces.most_used(&snap.caller.principal);
                tools.extend(snap.tools().map(|t| {
                    let always = self.gw.is_pinned(t.name()) || often.iter().any(|n| n == t.name());
                    surface::deferred(self.served(snap, t), t, always)
                }));
            }
            (Surface::Tools | Surface::Groups, _) => {
                tools.extend(snap.tools().filter(|t| self.gw.listed_beside(t.name(), surface)).map(|t| t.tool.clone()))
            }
        }
        tools
    }

    /// What `initialize` answers `session`'s client beside the gateway's own details: which
    /// surface it was given and why (in `instructions`), and whether its tool list can change.
    pub(super) fn introduce(&self, result: &mut InitializeResult, session: &SessionHandle) {
        let Some(choice) = session.surface() else { return };
        // What it lists changes with the catalog when it lists backend tools, pinned tools or
        // find_tool's written description; only the meta-tools under an operator's fixed
        // description never change.
        if let Some(tools) = result.capabilities.tools.as_mut() {
            let changes =
                choice.surface.lists_backend_tools() || self.gw.has_pinned() || self.gw.find_tool_description.is_none();
            tools.list_changed = changes.then_some(true);
        }
        result.instructions = Some(instructions(choice));
    }

    /// The audit line for a session's start, with the surface it was given.
    pub(super) fn audit_start(&self, ctx: &RequestContext<RoleServer>, session: &SessionHandle) {
        if !self.gw.audit().is_on() {
            return;
        }
        let mut e = self.audit_entry("initialize", ctx, "allowed");
        // The id is the one the HTTP edge gives the session in this answer, not yet a header.
        if let Some(crate::session::shared::SessionKey(id)) = super::session_key(ctx) {
            e.session = Some(crate::audit::session_hash(id));
        }
        if let Some(choice) = session.surface() {
            (e.target, e.detail) = (Some(choice.surface.name().to_string()), Some(choice.why.clone()));
        }
        self.gw.audit().record(e);
    }
}

/// What a client is told at initialize about how to use what it is shown.
pub fn instructions(choice: &Choice) -> String {
    let how = match choice.surface {
        Surface::Passthrough => "Every backend tool is listed; names carry the backend they come from.",
        Surface::Tools => {
            "Tools are found on demand: call find_tool with the capability you need, then call_tool with the name it returns."
        }
        Surface::Deferred => {
            "Every tool you may use is listed, named after its backend: call it by its name. When you do not know which \
             tool does something, find_tool searches them all by what they do."
        }
        Surface::Groups => {
            "Tools come in groups, one per backend: groups/list names them and groups/get hands out a group's tools. \
             find_tool searches every group by what its tools do, and call_tool runs any of them."
        }
    };
    format!("{how}\n\nSurface: {}.", choice.why)
}
