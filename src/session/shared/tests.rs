use super::*;

fn client() -> InitializeRequestParams {
    serde_json::from_value(serde_json::json!({
        "protocolVersion": "2025-11-25",
        "capabilities": {"sampling": {}},
        "clientInfo": {"name": "t", "version": "1"}
    }))
    .unwrap()
}

#[test]
fn a_record_round_trips_through_its_fields() {
    let record = Record {
        principal: "alice".into(),
        client: client(),
        level: Some("warning".into()),
        subscriptions: vec!["file:///a".into(), "file:///b".into()],
        upstreams: BTreeMap::from([("db".to_string(), "-".to_string())]),
        created_ms: 5,
        seen_ms: 0,
        version: 7,
    };
    let fields: HashMap<String, String> = SharedSessions::fields_of(&record).into_iter().collect();
    let back = Record::from_fields(&fields).unwrap();
    assert_eq!(back.principal, "alice");
    assert_eq!(back.client, record.client);
    assert_eq!(back.level.as_deref(), Some("warning"));
    assert_eq!(back.subscriptions, record.subscriptions);
    assert_eq!(back.upstreams, record.upstreams);
    assert_eq!(back.created_ms, 5);
    assert!(back.seen_ms > 0);
    assert_eq!(back.version, 7);
}

#[test]
fn a_record_without_its_principal_is_not_a_session() {
    let mut fields: HashMap<String, String> =
        SharedSessions::fields_of(&Record::from_fields(&base()).unwrap()).into_iter().collect();
    fields.remove(PRINCIPAL);
    assert!(Record::from_fields(&fields).is_err());
}

fn base() -> HashMap<String, String> {
    HashMap::from([
        (PRINCIPAL.to_string(), "bob".to_string()),
        (CLIENT.to_string(), serde_json::to_string(&client()).unwrap()),
    ])
}

#[test]
fn changes_set_and_remove_fields() {
    let mut fields = Fields::new();
    Change::Subscribed("file:///x".into()).apply(&mut fields);
    Change::Level("error".into()).apply(&mut fields);
    assert_eq!(fields.get("sub:file:///x").map(String::as_str), Some("1"));
    let (set, del) = Change::Unsubscribed("file:///x".into()).apply(&mut fields);
    assert!(set.is_none());
    assert_eq!(del.as_deref(), Some("sub:file:///x"));
    assert!(!fields.contains_key("sub:file:///x"));
    assert_eq!(fields.get(LEVEL).map(String::as_str), Some("error"));
}

#[tokio::test]
async fn a_sealed_backend_session_opens_only_for_its_session_and_backend() {
    let cfg = |secret: u8| RedisConfig {
        url: "redis://127.0.0.1:1".into(),
        key_prefix: "p:".into(),
        timeout: Duration::from_millis(50),
        tls_ca: None,
        seal_key: Some(SealKey([secret; 32])),
    };
    let s = SharedSessions::new(&cfg(7), Duration::from_secs(60)).unwrap();
    let init = serde_json::from_value(serde_json::json!({
        "protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "kit", "version": "1"}
    }))
    .unwrap();
    let stored = StoredUpstream { id: "upstream-session-42".into(), init };
    let sealed = s.seal("client-1", "kit", &stored);
    assert!(!sealed.contains("upstream-session-42"), "{sealed}");
    assert_eq!(s.unseal("client-1", "kit", &sealed), Some(stored.clone()));
    assert_eq!(s.unseal("client-2", "kit", &sealed), None, "another session's record");
    assert_eq!(s.unseal("client-1", "db", &sealed), None, "another backend");
    assert_eq!(s.unseal("client-1", "kit", &sealed[..sealed.len() - 2]), None, "cut short");
    let other = SharedSessions::new(&cfg(8), Duration::from_secs(60)).unwrap();
    assert_eq!(other.unseal("client-1", "kit", &sealed), None, "another secret");
    // Without a secret nothing is stored to take over.
    let mut plain = cfg(7);
    plain.seal_key = None;
    let none = SharedSessions::new(&plain, Duration::from_secs(60)).unwrap();
    assert_eq!(none.seal("client-1", "kit", &stored), "-");
    assert_eq!(none.unseal("client-1", "kit", &sealed), None);
}

#[tokio::test]
async fn keys_hide_the_session_id() {
    let cfg = RedisConfig {
        url: "redis://127.0.0.1:1".into(),
        key_prefix: "p:".into(),
        timeout: Duration::from_millis(50),
        tls_ca: None,
        seal_key: None,
    };
    let s = SharedSessions::new(&cfg, Duration::from_secs(60)).unwrap();
    let key = s.key("secret-session-id");
    assert!(key.starts_with("p:session:") && !key.contains("secret"), "{key}");
    assert_eq!(key.len(), "p:session:".len() + 64);
    assert!(s.ended_key("secret-session-id").starts_with("p:ended:"));
    assert_eq!(s.ended_key("secret-session-id")["p:ended:".len()..], key["p:session:".len()..]);
}

#[tokio::test]
async fn an_unreachable_store_fails_fast_and_says_so() {
    // Nothing listens on port 1.
    let cfg = RedisConfig {
        url: "redis://127.0.0.1:1".into(),
        key_prefix: "p:".into(),
        timeout: Duration::from_millis(200),
        tls_ca: None,
        seal_key: None,
    };
    let s = SharedSessions::new(&cfg, Duration::from_secs(60)).unwrap();
    let started = Instant::now();
    assert!(s.fetch("x").await.is_err());
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let status = s.status();
    assert_eq!(status.state, "down");
    assert!(status.last_error.is_some());
    assert_eq!(status.errors, 1);
    // Down: the next command is not even tried until the write-through's probe gets an answer.
    let started = Instant::now();
    assert!(s.fetch("y").await.is_err());
    assert!(started.elapsed() < Duration::from_millis(50), "{:?}", started.elapsed());
    assert_eq!(s.status().errors, 1);
}
