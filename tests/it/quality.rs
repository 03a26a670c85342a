//! Search quality on the vendored dev sets, through find_tool's own search path and the real
//! model: the figures docs/search.md reports must hold (floors half a point under the measured
//! values, so a different CPU's rounding passes and a real regression does not).

use std::path::PathBuf;
use toolmux::config::Precision;

use toolmux::eval::verdict::{Kind, Tally};
use toolmux::eval::{RANKERS, TextForm, evaluate};

fn data(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/data").join(path)
}

async fn fused(set: &str) -> toolmux::eval::Metrics {
    let evaluation = evaluate(
        &data(&format!("{set}/tools.jsonl")),
        &data(&format!("{set}/queries.dev.jsonl")),
        10,
        None,
        None,
        TextForm::Full,
        // The figures documented in docs/search.md are f32's (int8's: docs/performance.md).
        Precision::F32,
    )
    .await
    .unwrap();
    assert_eq!(RANKERS[0].0, "toolmux (fused)");
    evaluation.metrics[0].clone()
}

/// One test, so the tool vectors embedded for the ranking (minutes on a fresh machine) are in the
/// vector cache when the verdict and the server-aware set (most of whose texts are apigen's) are
/// measured.
#[tokio::test]
async fn find_tool_ranks_and_judges_the_dev_sets_as_documented() {
    ranks_as_documented().await;
    flags_what_does_not_fit().await;
    the_servers_label_wins_back_what_a_server_blind_text_loses().await;
    learning_gains_as_documented().await;
}

async fn ranks_as_documented() {
    // (set, R@8 floor, MRR@10 floor); measured 92.94 / 86.24 and 82.45 / 69.61.
    for (set, r8, mrr) in [("toolret-apigen", 92.4, 85.7), ("metatool", 81.9, 69.1)] {
        let m = fused(set).await;
        assert!(
            m.r8 >= r8 && m.mrr10 >= mrr,
            "{set}: R@8 {:.2} (floor {r8}), MRR@10 {:.2} (floor {mrr})",
            m.r8,
            m.mrr10
        );
    }
}

async fn flags_what_does_not_fit() {
    let rows = toolmux::eval::verdict::measure(
        &[data("toolret-apigen"), data("metatool")],
        Some(&data("multilingual/queries.jsonl")),
        None,
    )
    .await
    .unwrap();
    let flagged = |kind: Kind| Tally::pooled(&rows, kind).flagged();
    let apigen = rows.iter().find(|r| r.label.starts_with("toolret-apigen on its own")).unwrap();
    // Measured: 95.3 % of apigen's answerable queries good, 92.8 % of no-fit queries flagged
    // and 54.1 % `none`, 91.7 % of translated queries flagged (int8 on AVX-512 VNNI; on an
    // AVX2-only CPU, whose kernel has 7-bit weights, 53.5 % `none`: 2 requests of 316).
    assert!(apigen.tally.pct(apigen.tally.good) >= 94.0, "{rows:?}");
    assert!(flagged(Kind::NoFit) >= 90.0, "{rows:?}");
    let no_fit = Tally::pooled(&rows, Kind::NoFit);
    assert!(no_fit.pct(no_fit.none) >= 53.0, "half the no-fit requests are told nothing fits: {rows:?}");
    assert!(flagged(Kind::Translated) >= 85.0, "{rows:?}");

    // With learning (each set replayed in two folds, the query adapter fitted as the gateway
    // fits it): measured 77.7 % of metatool's answerable requests good (62.1 % by the cosine
    // alone, with nothing learned), no-fit 91.8 % flagged and 54.4 % `none` (on an AVX2-only CPU
    // 77.5 %, 90.8 % and 53.8 %).
    let sets = [data("toolret-apigen"), data("metatool")];
    let t = toolmux::eval::verdict::replay(&sets, None, toolmux::eval::SALT).await.unwrap();
    let (metatool, no_fit) = (&t[1], &t[3]);
    assert!(metatool.pct(metatool.good) >= 77.2, "{t:?}");
    assert!(no_fit.flagged() >= 90.5 && no_fit.pct(no_fit.none) >= 53.0, "{t:?}");
}

/// Learning from use, replayed as `toolmux eval-learning` does (two folds, key 1): the query
/// adapter lifts metatool over the per-tool bonus, and the offset it takes back from the tools it
/// learned is part of that lift. Measured (int8 on AVX-512 VNNI): the bonus 85.01, with the
/// adapter 86.49, with the offset taken back 87.38; apigen fits nothing, so nothing changes.
async fn learning_gains_as_documented() {
    let sets = [data("toolret-apigen"), data("metatool")];
    let m = toolmux::eval::learning::measure(&sets, None, toolmux::eval::SALT).await.unwrap();
    let (apigen, metatool) = (&m[0], &m[1]);
    assert!(apigen.served == 0 && apigen.shipped == apigen.bonus, "{m:?}");
    assert_eq!(metatool.served, 2, "the guard serves W in both folds: {m:?}");
    assert!(metatool.shipped >= 86.9 && metatool.shipped - metatool.bonus >= 1.5, "{m:?}");
    // What taking the offset back adds: 0.89 measured, about four requests of 507.
    assert!(metatool.shipped - metatool.adapter_whole >= 0.4, "{m:?}");
}

/// On toolret-apigen with the service moved out of 1,011 tool descriptions into a `server`
/// record (eval/derive_servers.py), the server's label in the index wins back what a text
/// without it loses. Measured: MRR@10 76.19 without the server, 81.54 with its label.
async fn the_servers_label_wins_back_what_a_server_blind_text_loses() {
    let dir = tempfile::tempdir().unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("eval/derive_servers.py");
    let status = std::process::Command::new("python3").arg(&script).arg(dir.path()).status().unwrap();
    assert!(status.success(), "{} failed", script.display());
    let mrr = |set: &str| {
        let (tools, queries) =
            (dir.path().join(set).join("tools.jsonl"), dir.path().join(set).join("queries.dev.jsonl"));
        async move {
            evaluate(&tools, &queries, 10, None, None, TextForm::Full, Precision::F32).await.unwrap().metrics[0].mrr10
        }
    };
    let (blind, aware) = (mrr("apigen-stripped").await, mrr("apigen-servers").await);
    // What is claimed is the gain (5.35 measured) and a floor under the result, not a ceiling on
    // the blind text: a search that improves without the label must not fail this test.
    assert!(aware - blind >= 4.0 && aware >= 81.0, "MRR@10 without the server {blind:.2}, with its label {aware:.2}");
}
