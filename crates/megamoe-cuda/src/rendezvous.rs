//! An [`AllGather`] through a directory that every process of a world can read and write (one
//! machine, no network): the processes of the command line's multi-process check, or any set of
//! processes without a framework's collective.
//!
//! Round n of rank r is the file `n.r`, written under a temporary name and renamed, so a reader
//! sees all of it or nothing. Every process calls the same rounds in the same order; a peer
//! whose file is missing at the deadline makes the call fail naming it (no hang).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::ranks::AllGather;

/// Rank `rank` of `size` processes meeting in `dir` (which must exist and start empty).
#[derive(Debug)]
pub struct FileRendezvous {
    dir: PathBuf,
    rank: usize,
    size: usize,
    deadline: Duration,
    round: u64,
}

/// How often a waiting process looks for its peers' files.
const POLL: Duration = Duration::from_millis(2);

impl FileRendezvous {
    /// Checks the arguments (before any file is written): `rank < size`, `dir` a directory.
    pub fn new(dir: &Path, rank: usize, size: usize, deadline: Duration) -> Result<Self> {
        crate::check_rank(rank, size)?;
        if !dir.is_dir() {
            return Err(Error::Invalid {
                arg: "dir",
                reason: format!("{} is not a directory", dir.display()),
            });
        }
        Ok(FileRendezvous {
            dir: dir.to_path_buf(),
            rank,
            size,
            deadline,
            round: 0,
        })
    }

    fn io_error(&self, what: &str, path: &Path, e: std::io::Error) -> Error {
        Error::Exchange {
            rank: self.rank,
            reason: format!("{what} {}: {e}", path.display()),
        }
    }
}

impl AllGather for FileRendezvous {
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let round = self.round;
        self.round += 1;
        let path = |r: usize| self.dir.join(format!("{round}.{r}"));
        let tmp = self.dir.join(format!("{round}.{}.tmp", self.rank));
        std::fs::write(&tmp, mine).map_err(|e| self.io_error("writing", &tmp, e))?;
        std::fs::rename(&tmp, path(self.rank)).map_err(|e| self.io_error("renaming", &tmp, e))?;
        let start = Instant::now();
        let mut all = Vec::with_capacity(self.size);
        for peer in 0..self.size {
            let file = path(peer);
            loop {
                match std::fs::read(&file) {
                    Ok(bytes) => break all.push(bytes),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(self.io_error("reading", &file, e)),
                }
                if start.elapsed() > self.deadline {
                    return Err(Error::Exchange {
                        rank: self.rank,
                        reason: format!(
                            "rank {peer} did not arrive at round {round} in {} within {} ms",
                            self.dir.display(),
                            self.deadline.as_millis()
                        ),
                    });
                }
                std::thread::sleep(POLL);
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("megamoe-rdv-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn every_rank_gets_every_ranks_bytes_in_rank_order_each_round() {
        let dir = temp_dir("gather");
        let deadline = Duration::from_secs(10);
        let results: Vec<Vec<Vec<Vec<u8>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|r| {
                    let dir = &dir;
                    s.spawn(move || {
                        let mut x = FileRendezvous::new(dir, r, 3, deadline).unwrap();
                        (0..2u8)
                            .map(|round| x.all_gather(&vec![round * 10 + r as u8; r + 1]).unwrap())
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for got in results {
            for (round, all) in got.iter().enumerate() {
                let want: Vec<Vec<u8>> = (0..3)
                    .map(|r| vec![round as u8 * 10 + r as u8; r + 1])
                    .collect();
                assert_eq!(all, &want);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_peer_that_never_arrives_fails_the_call_within_the_deadline_naming_it() {
        let dir = temp_dir("missing");
        let deadline = Duration::from_millis(200);
        let mut x = FileRendezvous::new(&dir, 0, 3, deadline).unwrap();
        // Rank 1 arrives, rank 2 never does.
        std::fs::write(dir.join("0.1"), b"one").unwrap();
        let start = Instant::now();
        let e = x.all_gather(b"zero").unwrap_err().to_string();
        assert!(start.elapsed() < deadline * 5, "{:?}", start.elapsed());
        assert!(
            e.starts_with("rank 0: handle exchange: rank 2 did not arrive"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn arguments_are_checked_before_any_file_is_written() {
        let dir = temp_dir("args");
        let e = FileRendezvous::new(&dir, 2, 2, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().starts_with("`rank`: 2"), "{e}");
        let e = FileRendezvous::new(&dir.join("absent"), 0, 2, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().starts_with("`dir`:"), "{e}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
