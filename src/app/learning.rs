//! The gateway's learning tasks: saving what find_tool learned, sharing its labels between
//! replicas, and fitting the query adapter in the background (`store::adapter`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::session::shared::SharedSessions;
use crate::store::Store;
use crate::store::adapter::Settings;
use crate::store::learned::{Fitted, Learned};

/// How often what find_tool learned is written to `optimizer.learning_file` (when it changed).
const SAVE_EVERY: Duration = Duration::from_secs(60);
/// How often a replica reads the labels the others (and it) added to the store.
const LABELS_READ_EVERY: Duration = Duration::from_secs(1);
/// How often the fitter looks at what arrived (and, with replicas, at the store's adapter).
const FIT_CHECK_EVERY: Duration = Duration::from_secs(5);
/// New labels that make the adapter be fitted again.
const REFIT_AFTER: u64 = 25;
/// With fewer new labels than that, a fit still runs this long after the last one.
const REFIT_EVERY: Duration = Duration::from_secs(3600);
/// How long a replica's claim to fit for all lasts, at most.
const FITTER_CLAIM: Duration = Duration::from_secs(600);

/// Shares what find_tool learns with the other replicas: labels made here go to the store's
/// stream, and every label in the stream, this replica's own included, is applied in the
/// stream's order, so every replica ranks a request the same way (within a second). A label
/// that cannot be written is applied here alone. A replica started later learns from the
/// labels the stream still keeps.
pub(super) async fn share(learned: Arc<Learned>, store: Arc<SharedSessions>, ct: CancellationToken) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let salt = loop {
        match store.learned_salt(rand::random()).await {
            Ok(salt) => break salt,
            Err(e) => tracing::debug!(error = %e.0, "the store is not answering: find_tool learns here until it does"),
        }
        tokio::select! {
            _ = ct.cancelled() => return,
            _ = tokio::time::sleep(LABELS_READ_EVERY) => {}
        }
    };
    learned.share(salt, tx);
    let mut after = "0".to_string();
    let mut tick = tokio::time::interval(LABELS_READ_EVERY);
    loop {
        tokio::select! {
            _ = ct.cancelled() => return,
            Some(label) = rx.recv() => {
                if let Err(e) = store.add_label(&label).await {
                    tracing::warn!(error = %e.0, "a find_tool label could not be shared: applied on this replica only");
                    learned.apply(&label);
                }
            }
            _ = tick.tick() => {
                // Read until caught up (a batch is at most 512 labels).
                while let Ok((labels, last)) = store.labels_after(&after).await {
                    labels.iter().for_each(|l| learned.apply(l));
                    after = last;
                    if labels.len() < 512 {
                        break;
                    }
                }
            }
        }
    }
}

/// Saves what find_tool learned every [`SAVE_EVERY`] it changed, and once more at stop.
pub(super) async fn keep(learned: Arc<Learned>, ct: CancellationToken) {
    let save = || {
        if let Err(e) = learned.save() {
            tracing::warn!(error = %format!("{e:#}"), "what find_tool learned could not be saved (optimizer.learning_file)");
        }
    };
    loop {
        tokio::select! {
            _ = ct.cancelled() => break,
            _ = tokio::time::sleep(SAVE_EVERY) => save(),
        }
    }
    save();
}

/// Fits the query adapter when [`REFIT_AFTER`] new labels arrived (or [`REFIT_EVERY`] after the
/// last fit, if any did), off the request path: on a blocking thread, one core at most and
/// resting as long as it works, so a fit takes at most half a core. With replicas, one replica
/// at a time claims the fit, writes the outcome to the store with the next version, and every
/// replica (itself too) serves what the store holds.
pub(super) async fn fit_adapter(
    learned: Arc<Learned>,
    store: Arc<Store>,
    shared: Option<Arc<SharedSessions>>,
    ct: CancellationToken,
) {
    let mut attempted = learned.last_fit().map_or(0, |(_, labels)| labels);
    let mut attempted_at = Instant::now();
    let mut seen: Option<u64> = None;
    let mut tick = tokio::time::interval(FIT_CHECK_EVERY);
    loop {
        tokio::select! {
            _ = ct.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Some(shared) = &shared
            && let Some(labels) = adopt(&learned, shared, &mut seen).await
        {
            // Another replica fitted on these labels: no need to fit them again here.
            attempted = attempted.max(labels);
            attempted_at = Instant::now();
        }
        let total = learned.total();
        let due = total >= attempted + REFIT_AFTER || (total > attempted && attempted_at.elapsed() >= REFIT_EVERY);
        if !due {
            continue;
        }
        if let Some(shared) = &shared
            && !shared.adapter_claim(FITTER_CLAIM).await.unwrap_or(false)
        {
            continue;
        }
        (attempted, attempted_at) = (total, Instant::now());
        let Some((keys, tools)) = store.current().tool_vectors() else { continue };
        let (l, stop) = (learned.clone(), ct.clone());
        let fitted = tokio::task::spawn_blocking(move || {
            let last = std::cell::Cell::new(Instant::now());
            // Between batches: rest as long as the batch took.
            let between = || {
                std::thread::sleep(last.get().elapsed());
                last.set(Instant::now());
                stop.is_cancelled()
            };
            l.fit(&keys, &tools, Settings::default(), &between)
        })
        .await;
        let Ok(Some(fitted)) = fitted else {
            learned.considered(total);
            continue;
        };
        tell(&fitted);
        match &shared {
            None => {
                let version = learned.next_version();
                learned.install(fitted, version);
            }
            Some(shared) => match shared.adapter_put(&fitted).await {
                Ok(_) => {
                    adopt(&learned, shared, &mut seen).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e.0, "the query adapter could not be shared: the replicas keep the one they serve")
                }
            },
        }
        learned.considered(total);
    }
}

/// Serves the store's adapter if its version is not the one `seen` last; the labels it was
/// fitted on, if it was new.
async fn adopt(learned: &Learned, shared: &SharedSessions, seen: &mut Option<u64>) -> Option<u64> {
    let version = shared.adapter_version().await.ok()??;
    if *seen == Some(version) {
        return None;
    }
    match shared.adapter_record().await {
        Ok(Some(record)) => {
            *seen = Some(version);
            match Fitted::from_record(&record, learned.dim()) {
                Ok((fitted, version)) => {
                    let labels = fitted.labels;
                    learned.install(fitted, version);
                    Some(labels)
                }
                Err(why) => {
                    tracing::warn!(version, why, "the replicas' query adapter was not used");
                    None
                }
            }
        }
        Ok(None) => None,
        Err(e) => {
            tracing::debug!(error = %e.0, "the replicas' query adapter could not be read");
            None
        }
    }
}

fn tell(fitted: &Fitted) {
    let j = &fitted.judged;
    let outcome = if fitted.adapter.is_some() { "served" } else { "not served: the identity is kept" };
    tracing::info!(
        labels = j.fitted,
        held_out = j.held_out,
        "query adapter fitted in {:.1} s: recall@8 on held-back labels {:.1} -> {:.1}, {outcome}",
        j.seconds,
        j.plain,
        j.adapted
    );
}
