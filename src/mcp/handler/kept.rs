//! Kept results read back: the `read_result` tool and `resources/read` on
//! `toolmux://results/…`, each answered from the gateway's kept results for this request's
//! principal alone (`crate::results`).

use rmcp::ErrorData;
use rmcp::model::{CallToolResult, JsonObject, ReadResourceResult};
use rmcp::service::{RequestContext, RoleServer};

use super::GatewayHandler;
use crate::results::{self, read};

impl GatewayHandler {
    /// Whether `read_result` is offered: results are kept, and no backend tool has its name.
    pub(super) fn offers_read_result(&self, snap: &crate::session::Snapshot) -> bool {
        self.gw.results.keeps() && snap.tool(results::READ_RESULT).is_none()
    }

    /// A catalog tool as passthrough lists it to this caller: with
    /// `_meta["anthropic/maxResultSizeChars"]` at what toolmux lets through (a tool's own smaller
    /// figure kept), so that Claude Code does not cut again what toolmux cut already.
    pub(super) fn served(&self, snap: &crate::session::Snapshot, t: &crate::catalog::CatalogTool) -> rmcp::model::Tool {
        let mut tool = t.tool.clone();
        let bound = self.gw.results.bound(&snap.caller, &t.key.backend, &t.key.tool);
        if bound.tokens > 0 {
            let mut meta = tool.meta.take().unwrap_or_default();
            let ours = results::max_result_chars(bound);
            let chars = meta.0.get(results::MAX_RESULT_CHARS).and_then(|v| v.as_u64()).map_or(ours, |c| c.min(ours));
            meta.0.insert(results::MAX_RESULT_CHARS.into(), chars.into());
            tool.meta = Some(meta);
        }
        tool
    }

    /// `read_result`: a piece of one of this caller's kept results, and its audit line.
    pub(super) async fn read_result(
        &self,
        args: Option<&JsonObject>,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let principal = self.caller(ctx).principal;
        let answer = match read::parse(args) {
            Ok(r) => {
                let found = self.find_kept(&principal, &r).await;
                read::answer(found, &r, self.gw.results.read_cap())
            }
            Err(m) => crate::mcp::meta::error_result(m),
        };
        if self.gw.audit().is_on() {
            let failed = answer.is_error == Some(true);
            let mut e = self.audit_entry("read_result", ctx, if failed { "refused" } else { "allowed" });
            e.target = args.and_then(|a| a.get("id")).and_then(|v| v.as_str()).map(str::to_owned);
            e.status = Some(if failed { "is_error" } else { "ok" });
            self.gw.audit().record(e);
        }
        answer
    }

    /// `resources/read` of a kept result's URI.
    pub(super) async fn read_kept(
        &self,
        uri: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        let r = read::parse_uri(uri)?;
        let found = self.find_kept(&self.caller(ctx).principal, &r).await;
        read::resource(found, uri, &r)
    }

    /// The kept part `r` names, if `principal` may read it; else what to tell them.
    async fn find_kept(&self, principal: &str, r: &read::Read) -> Result<results::Part, String> {
        let results = &self.gw.results;
        results.read(principal, &r.id, r.part.as_deref()).await.map_err(|miss| results.miss_message(&r.id, &miss))
    }
}
