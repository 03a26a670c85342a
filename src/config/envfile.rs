//! `env_file`: the values of `${VAR}` references kept beside a configuration, one `NAME=value` a
//! line (what `toolmux import` writes the secrets it finds into). It holds secrets, so on Unix a
//! file that other users can read is refused rather than used.

use std::collections::BTreeMap;
use std::path::Path;

/// Reads the variables of an env file; the error says what to do about it.
pub fn read(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "{} holds secrets but other users may read it (mode {:o}); run `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            ));
        }
    }
    parse(&text).map_err(|(line, why)| format!("{} line {line}: {why}", path.display()))
}

/// Parses `NAME=value` lines; `#` starts a comment line; a value in double quotes is a JSON string
/// (so it may hold any character), any other is taken as written, trimmed.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, (usize, String)> {
    let mut vars = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((name, value)) = line.split_once('=') else {
            return Err((i + 1, "expected NAME=value".into()));
        };
        let name = name.trim();
        if !is_name(name) {
            return Err((i + 1, format!("`{name}` is not a variable name (letters, digits, `_`)")));
        }
        let value = value.trim();
        let value = if value.starts_with('"') {
            serde_json::from_str::<String>(value)
                .map_err(|_| (i + 1, format!("the quoted value of `{name}` is not closed or has a bad escape")))?
        } else {
            value.to_string()
        };
        vars.insert(name.to_string(), value);
    }
    Ok(vars)
}

/// One `NAME=value` line that [`parse`] reads back as `value`; a name that is not a variable's
/// (which could end the line and start another) is refused.
pub fn line(name: &str, value: &str) -> Result<String, String> {
    if !is_name(name) {
        return Err(format!("`{}` is not a variable name (letters, digits, `_`)", name.escape_default()));
    }
    let plain =
        !value.is_empty() && value.trim() == value && !value.starts_with('"') && value.chars().all(|c| !c.is_control());
    Ok(if plain { format!("{name}={value}\n") } else { format!("{name}={}\n", serde_json::Value::from(value)) })
}

/// Whether `name` can be a variable's name.
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_back_as_written() {
        let values = ["plain", "with spaces inside", " padded ", "\"quoted\"", "new\nline", "", "a=b#c"];
        let text: String = values.iter().enumerate().map(|(i, v)| line(&format!("V{i}"), v).unwrap()).collect();
        let vars = parse(&format!("# secrets\n\n{text}export OTHER = x\n")).unwrap();
        for (i, v) in values.iter().enumerate() {
            assert_eq!(vars[&format!("V{i}")], *v);
        }
        assert_eq!(vars["OTHER"], "x");
    }

    #[test]
    fn a_name_that_could_start_another_line_is_refused() {
        for name in ["A\nB", "A=B", "", "1A", "A B", "A#"] {
            assert!(line(name, "x").unwrap_err().contains("not a variable name"), "{name:?}");
        }
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(parse("A=1\nnonsense\n").unwrap_err().0, 2);
        assert!(parse("1A=x").unwrap_err().1.contains("not a variable name"));
        assert!(parse("A=\"open").unwrap_err().1.contains("not closed"));
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("toolmux.env");
        std::fs::write(&path, "A=1\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read(&path).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).unwrap()["A"], "1");
    }
}
