//! Creating the files an import or a connect writes, with modes that never widen who may read
//! what a host file held: a new file is created whole, exclusively, with the mode it needs from
//! the start (never written first and narrowed after).

use std::path::Path;

use anyhow::Context;

/// Readable and writable by the owner only.
pub const PRIVATE: u32 = 0o600;
/// The usual mode of a configuration file that holds no secret.
pub const SHARED: u32 = 0o644;

/// Creates `path`, which must not exist, holding `bytes`, with `mode` on Unix (the umask may
/// narrow it further, never widen it).
pub fn create_new(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
    f.sync_all().with_context(|| format!("writing {}", path.display()))
}

/// The permission bits of an existing file; `None` where there is no file or no such bits.
pub fn mode_of(path: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).ok().map(|m| m.permissions().mode() & 0o777)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Makes an existing file readable by its owner only.
pub fn make_private(path: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(PRIVATE))
            .with_context(|| format!("making {} readable by you only", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_has_its_mode_from_the_start_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        create_new(&path, b"one", PRIVATE).unwrap();
        assert_eq!(mode_of(&path), Some(0o600));
        assert!(create_new(&path, b"two", PRIVATE).is_err(), "an existing file is not replaced");
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        make_private(&path).unwrap();
        assert_eq!(mode_of(&path), Some(0o600));
        assert_eq!(mode_of(&dir.path().join("missing")), None);
    }
}
