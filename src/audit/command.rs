//! `toolmux audit verify` and `toolmux audit summary`: what an operator (or an auditor with a
//! copy of the files) runs over a trail.

use std::path::PathBuf;
use std::process::ExitCode;

use super::verify;

/// Walks the chain through `files` (put in the order they were written) and prints where it
/// holds or where it breaks: exit 0, or 1 at the first line changed, removed or inserted.
pub fn verify(files: &[PathBuf], config: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    if files.is_empty() {
        anyhow::bail!("name the trail's files: the current one and the rotated ones beside it (FILE FILE.*)");
    }
    let key = match config {
        Some(path) => crate::config::Config::load(path)?.audit.key.map(|k| k.0),
        None => None,
    };
    let files = verify::in_order(files);
    match verify::verify(&files, key.as_deref())? {
        Ok(v) => {
            let from = match v.first_seq {
                Some(1) | None => String::new(),
                Some(n) => format!(" from line {n} of the trail (earlier files not given)"),
            };
            println!(
                "ok: {} lines in {} file(s){from} chain unbroken; head {}",
                v.lines,
                v.files,
                v.head.as_deref().unwrap_or("(empty)")
            );
            println!(
                "compare the head with the audit.head the gateway reported (/status) to know no line was cut off the end"
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(broken) => {
            println!("broken: {broken}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Prints the actions in `files` by day, principal and backend (a table, or JSON).
pub fn summary(files: &[PathBuf], json: bool) -> anyhow::Result<ExitCode> {
    let rows = verify::summarise(&verify::in_order(files))?;
    if json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|((day, principal, backend), r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["day"] = day.clone().into();
                v["principal"] = principal.clone().into();
                v["backend"] = backend.clone().into();
                v
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<10}  {:<20}  {:<16}  {:>7}  {:>6}  {:>8}  {:>7}  {:>6}  {:>13}  {:>11}  {:>12}",
        "day",
        "principal",
        "backend",
        "actions",
        "calls",
        "searches",
        "refused",
        "errors",
        "result tokens",
        "definitions",
        "tokens saved"
    );
    for ((day, principal, backend), r) in &rows {
        println!(
            "{day:<10}  {principal:<20}  {backend:<16}  {:>7}  {:>6}  {:>8}  {:>7}  {:>6}  {:>13}  {:>11}  {:>12}",
            r.actions, r.calls, r.searches, r.refused, r.errors, r.result_tokens, r.definition_tokens, r.saved_tokens
        );
    }
    Ok(ExitCode::SUCCESS)
}
