//! `groups/list` and `groups/get` (`mcp::groups`), for clients that declared the extension.

use rmcp::ErrorData;
use rmcp::model::{ClientCapabilities, CustomResult, ErrorCode, ExtensionCapabilities};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Value, json};

use super::GatewayHandler;
use crate::mcp::groups::GROUPS_EXTENSION;

impl GatewayHandler {
    /// Whether this request's client declared the groups extension (in the request's `_meta`, or
    /// at its session's initialize) and `[groups]` is on.
    pub(super) fn wants_groups(&self, ctx: &RequestContext<RoleServer>) -> bool {
        self.gw.groups.is_some() && ctx.client_capabilities().is_some_and(|c| crate::mcp::groups::declared(&c))
    }

    /// `groups/list` or `groups/get`.
    pub(super) fn groups_request(
        &self,
        method: &str,
        params: Option<&Value>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        let Some(groups) = &self.gw.groups else {
            return Err(ErrorData::new(ErrorCode::METHOD_NOT_FOUND, method.to_string(), None));
        };
        if !self.wants_groups(ctx) {
            let mut extensions = ExtensionCapabilities::new();
            extensions.insert(GROUPS_EXTENSION.into(), Default::default());
            let mut required = ClientCapabilities::default();
            required.extensions = Some(extensions);
            return Err(ErrorData::missing_required_client_capability(required));
        }
        let snap = self.snapshot(ctx);
        if method == crate::mcp::groups::LIST {
            return Ok(CustomResult::new(json!({"groups": groups.list(&snap, &self.gw)})));
        }
        let name = match params.and_then(|p| p.get("name")) {
            Some(Value::String(n)) if !n.is_empty() => n.as_str(),
            _ => {
                return Err(ErrorData::invalid_params(
                    "groups/get needs the name of a group from groups/list: {\"name\": \"<group>\"}",
                    None,
                ));
            }
        };
        // A group the caller may not see answers as one that does not exist.
        let group = groups
            .get(name, &snap, &self.gw)
            .ok_or_else(|| ErrorData::resource_not_found(format!("group not found: {name}"), None))?;
        // The group's tool definitions are what the caller is served, counted like a listing.
        for t in group["contents"]["tools"].as_array().into_iter().flatten() {
            let backend = t["name"].as_str().and_then(|n| snap.tool(n)).map(|c| c.key.backend.to_string());
            let tokens = crate::catalog::tokens_of(t);
            let kind = crate::metrics::tokens::Kind::Definitions;
            self.gw.metrics.tokens.add(&snap.caller.principal, backend.as_deref().unwrap_or(name), kind, tokens);
        }
        Ok(CustomResult::new(group))
    }
}
