//! The disk cache of compiled kernels.
//!
//! One file per kernel, named by a 128-bit hash of everything that determines the CUBIN (source,
//! headers, options, NVRTC version). A file is written under a unique temporary name in the same
//! folder and renamed into place, so readers in other processes see either nothing or a whole
//! entry; two processes compiling the same kernel both write and the last rename wins with
//! identical bytes.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"MEGAMOE-JIT-1\n";

/// FNV-1a over 128 bits: stable across Rust versions and processes (unlike `DefaultHasher`),
/// good enough to key a cache whose inputs nobody chooses adversarially.
#[derive(Clone)]
pub struct KeyHasher(u128);

impl Default for KeyHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyHasher {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    pub fn new() -> Self {
        Self(Self::OFFSET)
    }

    /// Adds one field; the length prefix keeps ("ab","c") and ("a","bc") apart.
    pub fn field(&mut self, bytes: &[u8]) -> &mut Self {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= *b as u128;
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
        self
    }

    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

/// The cache folder: `$MEGAMOE_JIT_CACHE_DIR`, else `$XDG_CACHE_HOME/megamoe/jit`, else
/// `$HOME/.cache/megamoe/jit`, else a folder in the system temporary directory.
pub fn dir() -> PathBuf {
    let var = |v: &str| {
        std::env::var_os(v)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    };
    var("MEGAMOE_JIT_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("megamoe/jit")))
        .or_else(|| var("HOME").map(|d| d.join(".cache/megamoe/jit")))
        .unwrap_or_else(|| std::env::temp_dir().join("megamoe-jit"))
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.cubin"))
}

/// Reads an entry: `(cubin, log)`, or `None` when absent or not a whole entry.
pub fn load(dir: &Path, key: &str) -> Option<(Vec<u8>, String)> {
    let bytes = std::fs::read(entry_path(dir, key)).ok()?;
    let rest = bytes.strip_prefix(MAGIC)?;
    let (log, rest) = take_field(rest)?;
    let (cubin, rest) = take_field(rest)?;
    rest.is_empty()
        .then(|| (cubin.to_vec(), String::from_utf8_lossy(log).into_owned()))
}

fn take_field(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?) as usize;
    let body = bytes.get(8..8usize.checked_add(len)?)?;
    Some((body, &bytes[8 + len..]))
}

/// Writes an entry atomically (temporary file + rename).
pub fn store(dir: &Path, key: &str, cubin: &[u8], log: &str) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Cache { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut bytes = Vec::with_capacity(MAGIC.len() + 16 + log.len() + cubin.len());
    bytes.extend_from_slice(MAGIC);
    for field in [log.as_bytes(), cubin] {
        bytes.extend_from_slice(&(field.len() as u64).to_le_bytes());
        bytes.extend_from_slice(field);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let tmp = dir.join(format!(
        ".{key}.{}.{thread}.{nanos}.tmp",
        std::process::id()
    ));
    std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
    let path = entry_path(dir, key);
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(&path)(e)
    })
}

/// Number of entries and their total bytes, for `megamoe info`.
pub fn summary(dir: &Path) -> (usize, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cubin"))
        .fold((0, 0), |(n, bytes), e| {
            (n + 1, bytes + e.metadata().map(|m| m.len()).unwrap_or(0))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_separates_fields_and_is_stable() {
        let a = KeyHasher::new().field(b"ab").field(b"c").hex();
        let b = KeyHasher::new().field(b"a").field(b"bc").hex();
        assert_ne!(a, b);
        assert_eq!(a, KeyHasher::new().field(b"ab").field(b"c").hex());
        // A fixed value (computed independently) guards against changes of the hash, which
        // would orphan every cache.
        assert_eq!(
            KeyHasher::new().field(b"abc").hex(),
            "e26a08d6c03843d82945a821b0f9ee7a"
        );
    }

    #[test]
    fn store_then_load_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        store(
            dir.path(),
            "k1",
            &[1, 2, 3, 0, 255],
            "ptxas info : Used 8 registers",
        )
        .unwrap();
        let (cubin, log) = load(dir.path(), "k1").unwrap();
        assert_eq!(cubin, vec![1, 2, 3, 0, 255]);
        assert_eq!(log, "ptxas info : Used 8 registers");
        assert!(load(dir.path(), "k2").is_none());
        assert_eq!(summary(dir.path()).0, 1);
    }

    #[test]
    fn truncated_entry_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), "k", &[7; 100], "log").unwrap();
        let path = entry_path(dir.path(), "k");
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(load(dir.path(), "k").is_none());
    }

    #[test]
    fn concurrent_writers_leave_one_whole_entry() {
        let dir = tempfile::tempdir().unwrap();
        let cubin = vec![42u8; 1 << 16];
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10 {
                        store(dir.path(), "same", &cubin, "log").unwrap();
                        let (c, _) = load(dir.path(), "same").unwrap();
                        assert_eq!(c, cubin);
                    }
                });
            }
        });
        let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(files.len(), 1, "temporary files left behind");
    }
}
