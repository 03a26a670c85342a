//! A backend's supervisor: connects the gateway's own connection, serves it (re-listing on
//! change notifications), reconnects with backoff when it is lost, and puts a stdio backend to
//! sleep after `idle_stop` unused, starting it again when a call rings (`sleep`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rmcp::model::{ServerNotification, SubscriptionFilter};
use rmcp::service::{RoleClient, RunningService};
use tokio_util::sync::CancellationToken;

use super::{
    BACKOFF_MAX, BACKOFF_START, Backend, CONNECT_TIMEOUT, Link, UpstreamClient, list_everything, oauth, words,
};

/// How a connection the supervisor served came to an end.
enum Ended {
    /// The gateway stops, or a reload retired the backend.
    Stopped,
    Lost,
    /// Unused for `idle_stop`: closed, the backend dormant until a call needs it.
    Idle,
}

impl Backend {
    /// Connects and reconnects until the backend is retired.
    pub async fn supervise(self: Arc<Self>) {
        let ct = self.retired.clone();
        let mut backoff = BACKOFF_START;
        // What was last said at warn: the same failure again is said at debug only.
        let mut said: Option<String> = None;
        loop {
            let attempt = tokio::time::timeout(CONNECT_TIMEOUT, self.connect());
            let outcome = tokio::select! {
                _ = ct.cancelled() => return,
                r = attempt => r.unwrap_or_else(|_| Err(self.no_answer())),
            };
            match outcome {
                Ok((service, listing)) => {
                    tracing::info!(backend = self.name(), tools = listing.tools.len(), "backend connected");
                    said = None;
                    self.failing.store(false, Ordering::Release);
                    *self.login_needed.lock().expect("login flag") = None;
                    backoff = BACKOFF_START;
                    self.listing.store(Arc::new(listing));
                    // A suspicion raised before this connection existed is not about it.
                    let _ = futures::FutureExt::now_or_never(self.suspect.notified());
                    let peer = Arc::new(service.peer().clone());
                    self.shared.store(Some(Arc::new(Link {
                        peer,
                        conn: service.service().conn,
                        own: None,
                        owner: None,
                    })));
                    self.tried.store(true, Ordering::Release);
                    self.sleep.woke();
                    self.bump();
                    let ended = self.serve_connection(service, &ct).await;
                    self.shared.store(None);
                    if matches!(ended, Ended::Idle) {
                        self.sleep.fall_asleep();
                    }
                    self.bump();
                    match ended {
                        Ended::Stopped => return,
                        Ended::Lost => {}
                        Ended::Idle => {
                            self.child.lock().expect("child story").take();
                            tracing::info!(
                                backend = self.name(),
                                "backend unused for its idle_stop: stopped; its next call starts it"
                            );
                            tokio::select! {
                                _ = ct.cancelled() => return,
                                _ = self.sleep.rung() => {}
                            }
                            backoff = BACKOFF_START;
                            continue;
                        }
                    }
                    let child = self.child.lock().expect("child story").take();
                    match child {
                        Some(child) => match child.ended_alone().await {
                            Some(why) => {
                                tracing::warn!(backend = self.name(), %why, "backend connection lost; restarting it");
                                *self.last_error.lock().expect("last error") =
                                    Some((why, std::time::SystemTime::now()));
                            }
                            None => tracing::warn!(backend = self.name(), "backend connection lost; restarting it"),
                        },
                        None => tracing::warn!(backend = self.name(), "backend connection lost; reconnecting"),
                    }
                }
                Err(err) => {
                    // A wake that failed: the backend is down now, like any other that is.
                    let woken = self.sleep.is_dormant();
                    self.sleep.woke();
                    let login = err.downcast_ref::<oauth::NeedsLogin>().cloned();
                    let first = !self.tried.swap(true, Ordering::AcqRel);
                    let error = match &login {
                        Some(needs) => needs.for_operator(),
                        None => words::explain(&err, &self.config),
                    };
                    *self.login_needed.lock().expect("login flag") = login;
                    if said.as_ref() != Some(&error) {
                        tracing::warn!(backend = self.name(), %error, retry_in = ?backoff, "backend unavailable");
                    } else {
                        tracing::debug!(backend = self.name(), %error, retry_in = ?backoff, "backend still unavailable");
                    }
                    self.failing.store(true, Ordering::Release);
                    said = Some(error.clone());
                    *self.last_error.lock().expect("last error") = Some((error, std::time::SystemTime::now()));
                    if first || woken {
                        self.bump();
                    }
                }
            }
            tokio::select! {
                _ = ct.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
                _ = self.suspect.notified() => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// A connection attempt that took longer than [`CONNECT_TIMEOUT`], in words.
    fn no_answer(&self) -> anyhow::Error {
        let child = self.child.lock().expect("child story").take();
        anyhow::Error::new(words::Told(match child {
            Some(child) => child.no_answer(CONNECT_TIMEOUT),
            None => format!("no answer within {}", humantime::format_duration(CONNECT_TIMEOUT)),
        }))
    }

    /// Waits for the connection to end, re-listing on change notifications.
    async fn serve_connection(
        &self,
        service: RunningService<RoleClient, UpstreamClient>,
        ct: &CancellationToken,
    ) -> Ended {
        let peer = service.peer().clone();
        let closed = service.cancellation_token();
        // 2026-07-28 has no session to push list changes on: hold a subscription open instead.
        let stateless = peer.peer_info().is_some_and(|i| !i.protocol_version.has_initialize());
        let mut changes = if stateless {
            let filter = SubscriptionFilter::builder()
                .tools_list_changed()
                .resources_list_changed()
                .prompts_list_changed()
                .build();
            match peer.listen(filter).await {
                Ok(sub) => Some(sub),
                Err(err) => {
                    tracing::warn!(backend = self.name(), %err, "subscriptions/listen refused; list changes will not be seen");
                    None
                }
            }
        } else {
            None
        };
        let mut waiting = Box::pin(service.waiting());
        loop {
            let change = async {
                match changes.as_mut() {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = change => match r {
                    Ok(Some(
                        ServerNotification::ToolListChangedNotification(_)
                        | ServerNotification::ResourceListChangedNotification(_)
                        | ServerNotification::PromptListChangedNotification(_),
                    )) => self.relist.notify_one(),
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        tracing::warn!(backend = self.name(), "the backend ended its subscriptions/listen stream");
                        changes = None;
                    }
                },
                _ = ct.cancelled() => {
                    closed.cancel();
                    let _ = waiting.await;
                    return Ended::Stopped;
                }
                _ = &mut waiting => return Ended::Lost,
                _ = self.suspect.notified() => {
                    // A call or probe saw this connection fail: drop it and connect afresh.
                    closed.cancel();
                    let _ = waiting.await;
                    return Ended::Lost;
                }
                _ = self.sleep.idle() => {
                    closed.cancel();
                    let _ = waiting.await;
                    return Ended::Idle;
                }
                _ = self.relist.notified() => {
                    match tokio::time::timeout(CONNECT_TIMEOUT, list_everything(&peer)).await {
                        Ok(Ok(listing)) => {
                            tracing::info!(backend = self.name(), tools = listing.tools.len(), "backend re-listed after a change notification");
                            self.listing.store(Arc::new(listing));
                            self.bump();
                        }
                        Ok(Err(err)) => tracing::warn!(backend = self.name(), %err, "re-listing failed"),
                        Err(_) => tracing::warn!(backend = self.name(), "re-listing timed out"),
                    }
                }
            }
        }
    }
}
