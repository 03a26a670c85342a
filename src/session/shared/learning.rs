//! What the replicas share besides sessions for the catalog and search: the tool ledger's
//! accepted and held maps (`catalog::ledger`), and find_tool's labels with the salt principals
//! are hashed under (`store::learned`).

use super::{SharedSessions, Unreachable};

/// find_tool labels kept in the replicas' stream (about 800 bytes each): a replica started
/// later learns from these.
const LABELS_KEPT: usize = 20_000;
/// The shared tool ledger's accepted and held maps, as (field, JSON) pairs.
pub type LedgerFields = (Vec<(String, String)>, Vec<(String, String)>);

impl SharedSessions {
    /// The replicas' shared tool ledger: its accepted and held maps (see `catalog::ledger`).
    pub async fn ledger_fields(&self) -> Result<LedgerFields, Unreachable> {
        let mut pipe = redis::pipe();
        pipe.hgetall(format!("{}ledger:accepted", self.prefix)).hgetall(format!("{}ledger:held", self.prefix));
        self.run::<LedgerFields>(&pipe).await
    }

    /// Writes what this replica's ledger adds to the shared one: a baseline only where no
    /// replica set one first.
    pub async fn ledger_write(&self, writes: &[crate::catalog::ledger::Write]) -> Result<(), Unreachable> {
        use crate::catalog::ledger::Write;
        if writes.is_empty() {
            return Ok(());
        }
        let (accepted, held) = (format!("{}ledger:accepted", self.prefix), format!("{}ledger:held", self.prefix));
        let mut pipe = redis::pipe();
        for w in writes {
            match w {
                Write::Baseline { field, json } => pipe.hset_nx(&accepted, field, json).ignore(),
                Write::Accept { field, json } => pipe.hset(&accepted, field, json).ignore(),
                Write::Hold { field, json } => pipe.hset(&held, field, json).ignore(),
                Write::Unhold { field } => pipe.hdel(&held, field).ignore(),
            };
        }
        self.run::<()>(&pipe).await
    }

    /// Accepts held versions in the shared ledger (all, one backend's, or one tool of it), as
    /// `toolmux tools accept` and the console do; every replica then serves them. Returns what
    /// was accepted, as (backend, tool).
    pub async fn accept_held(
        &self,
        backend: Option<&str>,
        tool: Option<&str>,
    ) -> Result<Vec<(String, String)>, Unreachable> {
        let (accepted, held) = self.ledger_fields().await?;
        let before = crate::catalog::ledger::Ledger::from_fields(&accepted, &held);
        let mut after = before.clone();
        let done = after.accept(backend, tool);
        self.ledger_write(&after.writes_since(&before)).await?;
        Ok(done)
    }

    /// The key every replica hashes principals under for find_tool's learning: `mine` if no
    /// replica set one first.
    pub async fn learned_salt(&self, mine: u64) -> Result<u64, Unreachable> {
        let key = format!("{}learned:salt", self.prefix);
        let mut pipe = redis::pipe();
        pipe.set_nx(&key, mine.to_string()).ignore().get(&key);
        let (salt,): (String,) = self.run(&pipe).await?;
        Ok(salt.parse().unwrap_or(mine))
    }

    /// Appends a find_tool label to the replicas' stream (the newest [`LABELS_KEPT`] are kept).
    pub async fn add_label(&self, label: &crate::store::learned::Label) -> Result<(), Unreachable> {
        let mut pipe = redis::pipe();
        pipe.cmd("XADD")
            .arg(format!("{}learned:labels", self.prefix))
            .arg("MAXLEN")
            .arg("~")
            .arg(LABELS_KEPT)
            .arg("*")
            .arg("b")
            .arg(&*label.tool.backend)
            .arg("t")
            .arg(&*label.tool.tool)
            .arg("w")
            .arg(label.who.to_string())
            .arg("v")
            .arg(label.packed_vector())
            .ignore();
        self.run::<()>(&pipe).await
    }

    /// Labels after stream id `after` (`0`: from the oldest kept), in the stream's order, with
    /// the id to read after next time.
    pub async fn labels_after(&self, after: &str) -> Result<(Vec<crate::store::learned::Label>, String), Unreachable> {
        type Entries = Vec<(String, Vec<(String, String)>)>;
        let start = if after == "0" { "-".to_string() } else { format!("({after}") };
        let mut pipe = redis::pipe();
        pipe.cmd("XRANGE").arg(format!("{}learned:labels", self.prefix)).arg(start).arg("+").arg("COUNT").arg(512);
        let (entries,): (Entries,) = self.run(&pipe).await?;
        let last = entries.last().map_or_else(|| after.to_string(), |(id, _)| id.clone());
        let labels = entries
            .into_iter()
            .filter_map(|(_, fields)| {
                let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
                let who = get("w")?.parse().ok()?;
                crate::store::learned::Label::unpack(get("b")?, get("t")?, who, get("v")?)
            })
            .collect();
        Ok((labels, last))
    }

    /// Claims the query adapter's next fit for this replica for `ttl`, if no replica holds a
    /// claim: whether it did.
    pub async fn adapter_claim(&self, ttl: std::time::Duration) -> Result<bool, Unreachable> {
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(format!("{}learned:adapter:fitter", self.prefix))
            .arg(std::process::id())
            .arg("NX")
            .arg("EX")
            .arg(ttl.as_secs().max(1));
        let (done,): (Option<String>,) = self.run(&pipe).await?;
        Ok(done.is_some())
    }

    /// Writes a fit of the query adapter as the next version (which it returns); the replicas
    /// serve it from their next look at [`SharedSessions::adapter_version`].
    pub async fn adapter_put(&self, fitted: &crate::store::learned::Fitted) -> Result<u64, Unreachable> {
        let mut pipe = redis::pipe();
        pipe.incr(format!("{}learned:adapter:next", self.prefix), 1);
        let (version,): (u64,) = self.run(&pipe).await?;
        let mut pipe = redis::pipe();
        pipe.set(format!("{}learned:adapter", self.prefix), fitted.to_record(version))
            .ignore()
            .set(format!("{}learned:adapter:version", self.prefix), version)
            .ignore()
            .del(format!("{}learned:adapter:fitter", self.prefix))
            .ignore();
        self.run::<()>(&pipe).await?;
        Ok(version)
    }

    /// The version of the query adapter the store holds, if any.
    pub async fn adapter_version(&self) -> Result<Option<u64>, Unreachable> {
        let mut pipe = redis::pipe();
        pipe.get(format!("{}learned:adapter:version", self.prefix));
        let (v,): (Option<u64>,) = self.run(&pipe).await?;
        Ok(v)
    }

    /// The query adapter's record as the store holds it (see `Fitted::to_record`).
    pub async fn adapter_record(&self) -> Result<Option<String>, Unreachable> {
        let mut pipe = redis::pipe();
        pipe.get(format!("{}learned:adapter", self.prefix));
        let (v,): (Option<String>,) = self.run(&pipe).await?;
        Ok(v)
    }
}
