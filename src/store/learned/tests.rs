//! Learning's bounds, its file and the query adapter's part in it.

use super::*;

fn key(t: &str) -> ToolKey {
    ToolKey { backend: "b".into(), tool: t.into() }
}

fn unit(v: &[f32]) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

#[test]
fn a_tool_counts_once_two_principals_labelled_it_and_the_store_has_enough() {
    let l = Learned::new(true, 2, None);
    let q = unit(&[1.0, 0.0]);
    for _ in 0..10 {
        l.record(&q, &key("a"), "alice");
    }
    // The documented 4 (docs/security.md), not whatever the constant says.
    assert_eq!(l.total(), 4, "one principal gives a tool at most 4 labels");
    assert_eq!(l.bonus(&q, &key("a")), 0.0, "one principal alone never makes a tool count");
    l.record(&q, &key("a"), "bob");
    assert!(l.bonus(&q, &key("a")) > 0.0);
    assert!(!l.active(), "the store has too few labels");
    for p in 0..MIN_TOTAL {
        l.record(&unit(&[0.0, 1.0]), &key("b"), &format!("p{p}"));
    }
    assert!(l.active());
    // Closer requests get more.
    assert!(l.bonus(&unit(&[1.0, 0.1]), &key("a")) > l.bonus(&unit(&[0.1, 1.0]), &key("a")));
    assert_eq!(l.bonus(&q, &key("unknown")), 0.0);
}

#[test]
fn one_principals_share_of_a_tool_is_bounded() {
    let l = Learned::new(true, 2, None);
    for p in 0..8 {
        l.record(&unit(&[1.0, 0.0]), &key("a"), &format!("p{p}"));
    }
    // Mallory pulls as hard as she can the other way: her labels stop at PER_PRINCIPAL.
    for _ in 0..1000 {
        l.record(&unit(&[0.0, 1.0]), &key("a"), "mallory");
    }
    assert!(l.bonus(&unit(&[1.0, 0.0]), &key("a")) > l.bonus(&unit(&[0.0, 1.0]), &key("a")));
}

#[test]
fn one_tools_weight_stops_growing() {
    let l = Learned::new(true, 2, None);
    for p in 0..10 * MAX_WEIGHT {
        l.record(&unit(&[1.0, 0.0]), &key("a"), &format!("p{p}"));
    }
    // As many labels again, elsewhere, turn it most of the way.
    for p in 0..MAX_WEIGHT {
        l.record(&unit(&[0.0, 1.0]), &key("a"), &format!("q{p}"));
    }
    assert!(l.bonus(&unit(&[0.0, 1.0]), &key("a")) > l.bonus(&unit(&[1.0, 0.0]), &key("a")));
}

#[test]
fn a_full_store_lets_the_least_recently_confirmed_tool_go() {
    let l = Learned::new(true, 2, None);
    for t in 0..MAX_TOOLS {
        l.record(&unit(&[1.0, 0.0]), &key(&t.to_string()), "alice");
    }
    l.tools.write().unwrap().get_mut(&key("0")).unwrap().confirmed = 0;
    l.record(&unit(&[1.0, 0.0]), &key("new"), "alice");
    let tools = l.tools.read().unwrap();
    assert_eq!(tools.len(), MAX_TOOLS);
    assert!(tools.contains_key(&key("new")) && !tools.contains_key(&key("0")));
}

#[test]
fn vectors_that_are_not_finite_are_never_kept() {
    let l = Learned::new(true, 2, None);
    l.record(&[f32::NAN, 0.0], &key("a"), "alice");
    l.record(&[f32::INFINITY, 0.0], &key("a"), "bob");
    assert_eq!(l.total(), 0);
}

#[test]
fn disabled_learns_nothing_and_the_file_round_trips() {
    let off = Learned::new(false, 2, None);
    off.record(&[1.0, 0.0], &key("a"), "alice");
    assert_eq!(off.total(), 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("learned.json");
    let l = Learned::new(true, 2, Some(path.clone()));
    for p in 0..5 {
        l.record(&unit(&[1.0, 2.0]), &key("a"), &format!("p{p}"));
    }
    l.record(&unit(&[1.0, 2.0]), &key("b"), "alice");
    l.save().unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let back = Learned::open(true, 2, Some(path.clone()));
    assert_eq!(back.total(), 6);
    assert!((back.bonus(&unit(&[1.0, 2.0]), &key("a")) - l.bonus(&unit(&[1.0, 2.0]), &key("a"))).abs() < 1e-6);
    // The same principals are told apart after a restart: alice's second label of b counts
    // as hers.
    back.record(&unit(&[1.0, 2.0]), &key("b"), "alice");
    assert_eq!(back.bonus(&unit(&[1.0, 2.0]), &key("b")), 0.0, "still one principal");
    // Another model's vectors are not used.
    assert_eq!(Learned::open(true, 3, Some(path)).total(), 0);
}

#[test]
fn result_sizes_keep_the_recent_ones_and_are_saved() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("learned.json");
    let l = Learned::new(false, 2, Some(path.clone()));
    assert_eq!(l.sizes(&key("a")), None);
    for t in 1..=100u64 {
        l.record_size(&key("a"), t * 100);
    }
    let s = l.sizes(&key("a")).unwrap();
    assert_eq!(s.calls, SIZE_SAMPLES, "only the most recent are kept");
    assert_eq!((s.p50, s.p95), (8_100, 9_800), "of 6,100..=10,000");
    l.save().unwrap();
    assert_eq!(Learned::open(false, 2, Some(path)).sizes(&key("a")), Some(s), "read back");
}

#[test]
fn an_unusable_file_is_set_aside_and_learning_starts_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("learned.json");
    std::fs::write(&path, b"{ not json").unwrap();
    let l = Learned::open(true, 2, Some(path.clone()));
    assert_eq!(l.total(), 0);
    assert!(!path.exists(), "moved aside");
    let aside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(aside.iter().any(|n| n.to_string_lossy().starts_with("learned.json.bad-")), "{aside:?}");
    // A file whose vector is not finite is as unusable.
    let nan = f32::NAN.to_le_bytes().iter().chain(&0f32.to_le_bytes()).map(|b| format!("{b:02x}")).collect::<String>();
    let file = format!(r#"{{"dim":2,"total":1,"tools":[["b","a",{{"sum":"{nan}","count":1}}]]}}"#);
    std::fs::write(&path, file).unwrap();
    assert_eq!(Learned::open(true, 2, Some(path.clone())).total(), 0);
    assert!(!path.exists());
}

#[test]
fn a_shared_label_is_packed_to_a_byte_per_dimension_and_applied_alike() {
    let v = unit(&[0.3, -0.8, 0.1, 0.5]);
    let label = Label { tool: key("a"), who: 7, vector: v.clone() };
    let packed = label.packed_vector();
    assert_eq!(packed.len(), 2 * v.len());
    let back = Label::unpack("b", "a", 7, &packed).unwrap();
    assert_eq!((back.tool.clone(), back.who), (key("a"), 7));
    assert!(back.vector.iter().zip(&v).all(|(x, y)| (x - y).abs() <= 0.5 / 127.0), "{:?}", back.vector);
    assert!(Label::unpack("b", "a", 7, "zz").is_none());
    // Shared, a label goes to the channel, not into this replica's vectors.
    let l = Learned::new(true, 4, None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    l.share(42, tx);
    l.record(&v, &key("a"), "alice");
    assert_eq!(l.total(), 0);
    let sent = rx.try_recv().unwrap();
    l.apply(&sent);
    assert_eq!(l.total(), 1);
}

/// Labels of tools `0..tools` of a 2-dimensional catalog, from `principals`, each request a
/// little off its tool.
fn taught(l: &Learned, tools: usize, principals: &[&str]) {
    for p in principals {
        for t in 0..tools {
            let a = t as f32 + 0.3;
            l.record(&unit(&[a.cos(), a.sin()]), &key(&t.to_string()), p);
        }
    }
}

fn catalog(tools: usize) -> (Vec<ToolKey>, Vec<f32>) {
    let keys = (0..tools).map(|t| key(&t.to_string())).collect();
    let vectors = (0..tools).flat_map(|t| [(t as f32).cos(), (t as f32).sin()]).collect();
    (keys, vectors)
}

#[test]
fn one_principals_labels_alone_teach_the_adapter_nothing() {
    let l = Learned::new(true, 2, None);
    taught(&l, 30, &["alice"]);
    let (keys, tools) = catalog(30);
    let examples = l.examples(|_, t| keys.iter().position(|k| &*k.tool == t));
    assert_eq!(examples.len(), 30, "her labels are kept");
    assert!(examples.iter().all(|e| !e.teaches), "none teaches: each tool has one principal");
    assert!(l.fit(&keys, &tools, adapter::Settings::default(), &|| false).is_none());
    assert!(l.adapt(&unit(&[1.0, 0.0])).is_none(), "nothing is served");
}

#[test]
fn one_principals_weight_in_a_fit_is_capped() {
    let l = Learned::new(true, 2, None);
    let ten: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
    let ten: Vec<&str> = ten.iter().map(String::as_str).collect();
    taught(&l, 20, &ten);
    // Mallory gives every one of those tools her 4 labels: 80 of 280 that teach.
    for _ in 0..4 {
        taught(&l, 20, &["mallory"]);
    }
    let (keys, _) = catalog(20);
    let examples = l.examples(|_, t| keys.iter().position(|k| &*k.tool == t));
    assert_eq!(examples.iter().filter(|e| e.teaches).count(), 280);
    let (hers, theirs): (Vec<&Example>, Vec<&Example>) = examples.iter().partition(|e| e.weight < 1.0);
    assert_eq!((hers.len(), theirs.len()), (80, 200), "only hers weigh less");
    let weight: f32 = hers.iter().map(|e| e.weight).sum();
    assert!((weight - PRINCIPAL_SHARE * 280.0).abs() < 1e-3, "her 80 labels weigh {weight}: a tenth of 280");
}

#[test]
fn the_adapter_is_saved_with_the_labels_and_one_that_does_not_verify_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("learned.json");
    let l = Learned::new(true, 2, Some(path.clone()));
    let mut w = Adapter::identity(2);
    w.w[1] = 0.5;
    let judged = Judged { fitted: 50, held_out: 10, plain: 60.0, adapted: 70.0, seconds: 0.1 };
    l.install(Fitted { adapter: Some(w.clone()), judged: judged.clone(), labels: 60 }, 3);
    l.record(&unit(&[1.0, 2.0]), &key("a"), "alice");
    l.save().unwrap();
    let back = Learned::open(true, 2, Some(path.clone()));
    let served = back.served().expect("read back and served");
    assert_eq!((back.version(), &*served), (Some(3), &w));
    assert_eq!(back.last_fit(), Some((judged, 60)));
    assert_eq!(back.pairs(), 1);
    assert_eq!(back.adapt(&unit(&[1.0, 0.0])), Some(w.apply(&unit(&[1.0, 0.0]))));
    // One number of the matrix changed: the digest no longer matches, so the file is copied
    // aside, its adapter not served, and its labels still count.
    let text = std::fs::read_to_string(&path).unwrap();
    let one = digest(&w.w);
    let file: serde_json::Value = serde_json::from_str(&text).unwrap();
    let record: serde_json::Value = serde_json::from_str(file["adapter"].as_str().unwrap()).unwrap();
    assert_eq!(record["adapter"]["sha256"], one.as_str());
    let matrix = record["adapter"]["w"].as_str().unwrap();
    let tampered = text.replace(matrix, &format!("0000803f{}", &matrix[8..]).replacen("0000803f", "0000003f", 1));
    assert_ne!(tampered, text);
    std::fs::write(&path, tampered).unwrap();
    let back = Learned::open(true, 2, Some(path.clone()));
    assert!(back.served().is_none() && back.adapt(&unit(&[1.0, 0.0])).is_none());
    assert_eq!((back.total(), back.pairs()), (1, 1), "the labels are kept");
    assert!(path.exists(), "the file stays where it is");
    let aside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(aside.iter().any(|n| n.to_string_lossy().starts_with("learned.json.bad-")), "{aside:?}");
}

#[test]
fn one_principals_labels_alone_do_not_change_a_fit() {
    let dim = 8;
    let l = Learned::new(true, dim, None);
    let (keys, tools): (Vec<ToolKey>, Vec<f32>) = {
        let keys: Vec<ToolKey> = (0..40).map(|t| key(&t.to_string())).collect();
        let tools = (0..40).flat_map(|t| (0..dim).map(move |d| ((t * 7 + d * 3) as f32).sin())).collect::<Vec<f32>>();
        let tools: Vec<f32> = tools.chunks(dim).flat_map(unit).collect();
        (keys, tools)
    };
    // Twenty principals label tools 0..10, each with requests of its own.
    for p in 0..20 {
        for t in 0..10 {
            let v: Vec<f32> = (0..dim).map(|d| ((p * 13 + t * 5 + d) as f32).cos()).collect();
            l.record(&unit(&v), &key(&t.to_string()), &format!("p{p}"));
        }
    }
    let before = l.fit(&keys, &tools, adapter::Settings::default(), &|| false).expect("enough labels teach");
    // Mallory alone labels tools 10..40, many times: none of it teaches, none of it judges.
    for round in 0..4 {
        for t in 10..40 {
            let v: Vec<f32> = (0..dim).map(|d| ((round * 17 + t * 11 + d) as f32).sin()).collect();
            l.record(&unit(&v), &key(&t.to_string()), "mallory");
        }
    }
    let after = l.fit(&keys, &tools, adapter::Settings::default(), &|| false).expect("the same labels teach");
    let same = |f: &Fitted| (f.adapter.clone(), f.judged.fitted, f.judged.held_out, f.judged.plain, f.judged.adapted);
    assert_eq!(same(&before), same(&after));
}

#[test]
fn a_served_adapter_takes_back_the_offset_from_tools_whose_labels_count_and_only_then() {
    use crate::index::Hit;
    let keys: Vec<ToolKey> = ["taught", "once", "never"].into_iter().map(key).collect();
    // "taught" counts (two principals); "once" has one principal's labels; "never" none.
    let learned = |enabled: bool, offset: f32, serve: bool| {
        let l = Learned::new(enabled, 2, None).offset(offset);
        l.record(&unit(&[1.0, 0.0]), &keys[0], "alice");
        l.record(&unit(&[1.0, 0.1]), &keys[0], "bob");
        l.record(&unit(&[0.0, 1.0]), &keys[1], "alice");
        if serve {
            let judged = Judged { fitted: 50, held_out: 10, plain: 60.0, adapted: 70.0, seconds: 0.1 };
            l.install(Fitted { adapter: Some(Adapter::identity(2)), judged, labels: 3 }, 1);
        }
        l
    };
    let hits = || vec![Hit { slot: 0, score: 0.80 }, Hit { slot: 1, score: 0.78 }, Hit { slot: 2, score: 0.77 }];
    let taken = |l: &Learned| {
        let mut h = hits();
        l.take_back(&mut h, |slot| &keys[slot as usize]);
        h
    };
    let h = taken(&learned(true, adapter::OFFSET, true));
    let order: Vec<u32> = h.iter().map(|h| h.slot).collect();
    assert_eq!(order, vec![1, 2, 0], "the taught tool falls behind the two within the offset");
    assert!((h[2].score - (0.80 - adapter::OFFSET)).abs() < 1e-6, "{h:?}");
    assert_eq!((h[0].score, h[1].score), (0.78, 0.77), "the others keep their scores");
    assert_eq!(taken(&learned(true, adapter::OFFSET, false)), hits(), "no adapter served: nothing changes");
    assert_eq!(taken(&learned(false, adapter::OFFSET, true)), hits(), "learning off: nothing changes");
    assert_eq!(taken(&learned(true, 0.0, true)), hits(), "an offset of 0 changes nothing");
}
