use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn cfg() -> HealthConfig {
    HealthConfig {
        interval: Duration::from_secs(1),
        timeout: Duration::from_millis(500),
        degraded_threshold: Duration::from_secs(5),
        unhealthy_threshold: 2,
        circuit_breaker: None,
        ..HealthConfig::default()
    }
}

const OK: Option<Duration> = Some(Duration::from_millis(5));
const SLOW: Option<Duration> = Some(Duration::from_secs(6));

#[test]
fn transitions_follow_the_reference() {
    let c = cfg();
    let now = Instant::now();
    let mut t = Tracker::new(now);
    assert_eq!(t.status, Status::Unknown);
    // A first probe that fails leaves it unknown, however many follow.
    t.observe(None, &c, now);
    t.observe(None, &c, now);
    t.observe(None, &c, now);
    assert_eq!(t.status, Status::Unknown);
    // First success after failures: degraded (recovering), then healthy.
    t.observe(OK, &c, now);
    assert_eq!(t.status, Status::Degraded);
    t.observe(OK, &c, now);
    assert_eq!(t.status, Status::Healthy);
    // One failure below the threshold: the previous status stands.
    t.observe(None, &c, now);
    assert_eq!(t.status, Status::Healthy);
    assert!(t.status.advertisable());
    // The threshold reached: unhealthy.
    t.observe(None, &c, now);
    assert_eq!(t.status, Status::Unhealthy);
    assert!(!t.status.advertisable());
    t.observe(OK, &c, now);
    assert_eq!(t.status, Status::Degraded);
    // Slow success is degraded, however long it lasts.
    t.observe(SLOW, &c, now);
    t.observe(SLOW, &c, now);
    assert_eq!(t.status, Status::Degraded);
    t.observe(OK, &c, now);
    assert_eq!(t.status, Status::Healthy);
}

#[test]
fn a_first_success_is_healthy_at_once() {
    let mut t = Tracker::new(Instant::now());
    assert!(t.observe(OK, &cfg(), Instant::now()));
    assert_eq!(t.status, Status::Healthy);
}
