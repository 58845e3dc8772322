//! A private temporary directory, removed on `Drop`: the demo's SQLite file and each private
//! `redis-server`'s data and log. A few lines of its own rather than the `tempfile` crate, which
//! only the lab and the tests link, never the deployed binary.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A fresh directory `<prefix><random>` under the system's temp dir (mode 0700), removed with
/// everything in it when dropped.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub(crate) fn new(prefix: &str) -> std::io::Result<Self> {
        let base = std::env::temp_dir();
        loop {
            let path = base.join(format!("{prefix}{:016x}", rand::random::<u64>()));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::TempDir;

    #[test]
    fn a_temp_dir_is_fresh_private_and_gone_after_drop() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (TempDir::new("seatrush-test-").unwrap(), TempDir::new("seatrush-test-").unwrap());
        assert_ne!(a.path(), b.path());
        assert_eq!(std::fs::metadata(a.path()).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::write(a.path().join("f"), "x").unwrap();
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists());
    }
}
