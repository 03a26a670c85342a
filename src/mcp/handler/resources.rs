//! Resources, templates and prompts: each comes from the advertised backends the caller may use
//! whole, and a request for one goes to the backend that serves it.

use std::collections::HashSet;
use std::sync::Arc;

use rmcp::ErrorData;
use rmcp::model::{Prompt, SubscribeRequestParams};
use rmcp::service::{RequestContext, RoleServer};

use super::{GatewayHandler, wire_error};
use crate::catalog::ConflictResolution;
use crate::catalog::ledger::Parts;
use crate::session::Caller;
use crate::upstream::Backend;

impl GatewayHandler {
    /// Subscribes this client to `request.uri` at the backend that serves it.
    pub(super) async fn subscribe_to(
        &self,
        request: SubscribeRequestParams,
        caller: &Caller,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some(backend) = self.resource_owner(caller, &request.uri) else {
            return Err(ErrorData::resource_not_found(format!("resource not found: {}", request.uri), None));
        };
        let uri = request.uri.clone();
        let link = self.link(&backend, context).await.map_err(wire_error)?;
        backend.subscribe(&link, request, &context.ct).await.map_err(wire_error)?;
        // A client's own upstream session sends its updates to that client alone already.
        if !link.is_own() {
            self.gw.relay.subscribe(&uri, context.peer.clone());
        }
        Ok(())
    }
}

impl GatewayHandler {
    /// The advertised backend serving `uri`: one that lists it, else one whose template fits it.
    pub(super) fn resource_owner(&self, caller: &Caller, uri: &str) -> Option<Arc<Backend>> {
        self.usable_backends(caller).find(|b| self.parts(b).resources.iter().any(|r| r.uri == uri)).or_else(|| {
            self.usable_backends(caller)
                .find(|b| self.parts(b).templates.iter().any(|t| template_matches(&t.uri_template, uri)))
        })
    }

    /// `backend`'s prompts, resources and templates as served: as the tool ledger lets them
    /// through (with tools frozen, `[health] freeze_tools`, a change waits to be accepted), and
    /// fenced ([`crate::fence`]).
    fn parts(&self, backend: &Backend) -> Arc<Parts> {
        self.gw.integrity.parts(backend.name())
    }

    /// The items of every backend `caller` may use, in backend order, each as `served` makes it
    /// for its backend; on a duplicate `key` the first backend's item wins.
    pub(super) fn merged<T: Clone, K: Eq + std::hash::Hash>(
        &self,
        caller: &Caller,
        items: impl Fn(&Parts) -> &Vec<T>,
        served: impl Fn(&str, &mut T),
        key: impl Fn(&T) -> K,
    ) -> Vec<T> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for b in self.usable_backends(caller) {
            let parts = self.parts(&b);
            for item in items(&parts) {
                let mut item = item.clone();
                served(b.name(), &mut item);
                if seen.insert(key(&item)) {
                    out.push(item);
                }
            }
        }
        out
    }

    /// Exposed prompts with their backend and original name; named like tools.
    pub(super) fn prompts(&self, caller: &Caller) -> Vec<(Prompt, Arc<Backend>, String)> {
        let agg = &self.gw.aggregation;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for b in self.usable_backends(caller) {
            for p in &self.parts(&b).prompts {
                let name = match agg.conflict_resolution {
                    ConflictResolution::Prefix => {
                        format!("{}{}", agg.prefix_format.replace("{backend}", b.name()), p.name)
                    }
                    _ => p.name.clone(),
                };
                if seen.insert(name.clone()) {
                    let mut exposed = p.clone();
                    exposed.name = name;
                    out.push((exposed, b.clone(), p.name.clone()));
                }
            }
        }
        out
    }
}

/// Whether `uri` fits an RFC 6570 template, matching literal parts and letting each `{…}` take
/// any non-empty run.
pub(super) fn template_matches(template: &str, uri: &str) -> bool {
    let mut rest = uri;
    let mut parts = template.split('{');
    let Some(first) = parts.next() else { return false };
    let Some(r) = rest.strip_prefix(first) else { return false };
    rest = r;
    for part in parts {
        let Some((_, literal)) = part.split_once('}') else { return false };
        if literal.is_empty() {
            return !rest.is_empty();
        }
        match rest.find(literal) {
            Some(i) if i > 0 => rest = &rest[i + literal.len()..],
            _ => return false,
        }
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    pub(super) fn templates_match_literal_parts() {
        assert!(template_matches("test://template/{id}/data", "test://template/42/data"));
        assert!(!template_matches("test://template/{id}/data", "test://template//data"));
        assert!(!template_matches("test://template/{id}/data", "test://other/42/data"));
        assert!(template_matches("file:///{path}", "file:///a/b.txt"));
        assert!(!template_matches("file:///{path}", "file:///"));
    }
}
