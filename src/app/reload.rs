//! Live reload: a new configuration applied to a running gateway without dropping a session.
//!
//! Backends are compared by name: an added one is connected, a removed one retired (no new
//! request reaches it; calls under way finish), a changed one replaced by a fresh connection
//! under the same name. The catalog task rebuilds the catalog from the new set (vectors of
//! unchanged tools come from the vector cache, so only new text is embedded) and every session
//! re-derives its scope. A changed `[[policy]]` is put in force at once, and so are changed
//! `[[limits]]`, `[[hooks]]`, `[results]` (scrubbing, result limits and keeping; backends' `scrub`,
//! `scrub_rules`, `max_result_*`),
//! bearer tokens or JWT settings (every request is authenticated, so the next one meets them).
//! Sections that shape the running process (listener, mode, model, health, naming, turning
//! authentication on or off, session store) are reported as needing a restart and keep their
//! running values.

use std::sync::Arc;

use serde::Serialize;

use super::App;
use crate::config::{AuthConfig, AuthMode, Config};
use crate::session::Policy;

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Reloaded {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// Whether `[[policy]]` changed (every session's scope was re-derived).
    pub policy: bool,
    /// Whether `[[limits]]` changed (put in force at once; counts kept by rule name).
    pub limits: bool,
    /// Whether `[[hooks]]` changed (put in force at once).
    pub hooks: bool,
    /// Whether `[results] scrub` or a backend's `scrub`/`scrub_rules` changed (at once).
    pub scrub: bool,
    /// Whether `[results]`' bounds or keeping, or a backend's, tool's or rule's limits changed.
    pub results: bool,
    /// Whether `[optimizer] surface` changed (for sessions that start from now on).
    pub surface: bool,
    /// Whether the bearer tokens or JWT settings changed (every request is checked against the new ones).
    pub auth: bool,
    /// Sections that changed but take effect only after a restart.
    pub needs_restart: Vec<&'static str>,
    /// With `[health] freeze_tools`: the tool ledger was read again (changes an operator
    /// accepted are served now), and this many versions are still held back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools_held: Option<usize>,
}

impl Reloaded {
    pub fn is_empty(&self) -> bool {
        *self == Reloaded::default()
    }
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return write!(f, "nothing changed");
        }
        let mut parts = Vec::new();
        for (what, names) in [("added", &self.added), ("removed", &self.removed), ("changed", &self.changed)] {
            if !names.is_empty() {
                parts.push(format!("{what} {}", names.join(", ")));
            }
        }
        if self.policy {
            parts.push("policy changed".into());
        }
        if self.limits {
            parts.push("limits changed".into());
        }
        if self.scrub {
            parts.push("scrubbing changed".into());
        }
        if self.results {
            parts.push("result limits changed".into());
        }
        if self.surface {
            parts.push("surfaces changed (for new sessions)".into());
        }
        if self.hooks {
            parts.push("hooks changed".into());
        }
        if self.auth {
            parts.push("authentication changed".into());
        }
        if !self.needs_restart.is_empty() {
            parts.push(format!("needs a restart to apply: {}", self.needs_restart.join(", ")));
        }
        if let Some(held) = self.tools_held {
            parts.push(format!("tool ledger read again: {held} tool versions held back"));
        }
        write!(f, "{}", parts.join("; "))
    }
}

/// Whether `[auth]` can go from `old` to `new` in a running gateway: which tokens, issuer, key
/// set or claims are accepted can; whether credentials are required at all (the policy's
/// defaults depend on it), the published resource URL, public health and the stdio caller cannot.
fn auth_changes_live(old: &AuthConfig, new: &AuthConfig) -> bool {
    let required = |a: &AuthConfig| !matches!(a.mode, AuthMode::None);
    required(old)
        && required(new)
        && old.resource_url == new.resource_url
        && old.public_health == new.public_health
        && old.stdio_principal == new.stdio_principal
        && old.stdio_groups == new.stdio_groups
}

impl App {
    /// Applies `next` (already validated: [`Config::load`] or [`Config::parse`]).
    pub async fn reload(&self, next: Config) -> Reloaded {
        // A JWT verifier loads its issuer's keys when built: before the configuration is locked.
        let running_auth = self.config.lock().expect("config lock").auth.clone();
        let auth = match next.auth != running_auth && auth_changes_live(&running_auth, &next.auth) {
            true => Some(crate::auth::Authenticator::new(&next.auth).await),
            false => None,
        };
        let done = self.apply(next, auth);
        let mut e = crate::audit::Entry::new("config/reload", "operator", "allowed");
        e.detail = Some(done.to_string());
        self.gateway.audit().record(e);
        done
    }

    fn apply(&self, mut next: Config, auth: Option<crate::auth::Authenticator>) -> Reloaded {
        let mut running = self.config.lock().expect("config lock");
        let mut done = Reloaded::default();
        let gw = &self.gateway;

        for old in &running.backends {
            if !next.backends.iter().any(|b| b.name == old.name) {
                gw.upstream.remove(&old.name);
                gw.health.remove(&old.name);
                done.removed.push(old.name.clone());
            }
        }
        for new in &next.backends {
            match running.backends.iter().find(|b| b.name == new.name) {
                Some(old) if old == new => continue,
                Some(_) => done.changed.push(new.name.clone()),
                None => done.added.push(new.name.clone()),
            }
            // Health first: the new connection is unknown until it has answered.
            gw.health.add(&new.name);
            let backend = gw.upstream.add(new.clone());
            self.start_backend(backend);
        }

        if next.policy != running.policy && self.policy_from_config {
            let rules = crate::auth::policy::Rules::new(&next.policy, self.auth_required);
            gw.set_policy(Arc::new(rules) as Arc<dyn Policy>);
            done.policy = true;
        }

        if next.limits != running.limits {
            gw.limiter.set_rules(&next.limits);
            done.limits = true;
        }
        if next.hooks != running.hooks {
            gw.hooks.set(&next.hooks);
            done.hooks = true;
        }
        if next.scrub != running.scrub {
            gw.scrubbing.set(&next.scrub);
            done.scrub = true;
        }
        if next.results != running.results {
            gw.results.set(&next.results);
            done.results = true;
        }
        if next.surface != running.surface {
            gw.surfaces.set(&next.surface);
            done.surface = true;
        }

        if let Some(auth) = auth {
            // The keys of the verifier in force are refreshed; the replaced one's refresh ends.
            let mut refresh = self.key_refresh.lock().expect("key refresh lock");
            refresh.cancel();
            *refresh = self.ct.child_token();
            if let Some(jwt) = auth.jwt() {
                self.tasks.spawn(jwt.run_refresh(refresh.clone()));
            }
            self.authenticator.store(Arc::new(auth));
            running.auth = next.auth.clone();
            done.auth = true;
        }

        // Who sees the gateway's details changes live, whatever else `[auth]` does.
        if next.auth.admins != running.auth.admins {
            running.auth.admins = next.auth.admins.clone();
            done.auth = true;
        }

        // What cannot change live keeps its running value, so it is reported until a restart.
        macro_rules! restart_only {
            ($($field:ident => $key:literal),* $(,)?) => {$(
                if next.$field != running.$field {
                    done.needs_restart.push($key);
                    next.$field = running.$field.clone();
                }
            )*};
        }
        restart_only!(
            server => "[server]",
            optimizer => "[optimizer]",
            health => "[health]",
            aggregation => "[aggregation]",
            auth => "[auth]",
            sessions => "[sessions]",
            audit => "[audit]",
            groups => "[groups]",
        );
        *running = next;
        gw.set_auth(running.auth.clone());
        // An operator may have accepted held tool changes in the ledger file (`toolmux tools accept`).
        if gw.integrity.is_frozen() {
            match gw.integrity.reread() {
                Ok(held) => done.tools_held = Some(held),
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "the tool ledger could not be read again; it is unchanged")
                }
            }
        }
        let mut log = self.gateway.reloads.lock().expect("reload log");
        log.applied += 1;
        log.last = Some(done.to_string());
        log.last_error = None;
        log.at = Some(unix_now());
        done
    }

    /// Applies a configuration read for a reload (SIGHUP, `--watch`), or records why the file
    /// was refused (the running configuration stays), and logs the outcome.
    pub async fn apply_reload(&self, next: anyhow::Result<Config>) {
        match next {
            Ok(next) => {
                let done = self.reload(next).await;
                if done.needs_restart.is_empty() {
                    tracing::info!("configuration reloaded: {done}");
                } else {
                    tracing::warn!("configuration reloaded: {done}");
                }
            }
            Err(err) => {
                tracing::error!("configuration not reloaded, the running one stays: {err:#}");
                self.reload_refused(format!("{err:#}"));
            }
        }
    }

    /// Records a reload refused because the new configuration is invalid.
    pub fn reload_refused(&self, why: String) {
        let mut e = crate::audit::Entry::new("config/reload", "operator", "refused");
        e.detail = Some(why.clone());
        self.gateway.audit().record(e);
        let mut log = self.gateway.reloads.lock().expect("reload log");
        log.last_error = Some(why);
        log.at = Some(unix_now());
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
