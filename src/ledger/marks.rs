//! Markers that let a stop of a container vramgate never held skip the ledger.
//!
//! Under podman and CRI-O the hook runs at every container's poststop, with or without a
//! request, and the wrapper's `delete` runs for every container an engine deletes; finding out
//! that the ledger holds nothing of a container took one unlocked read and parse of the whole
//! ledger. Instead, every commit keeps, in the state directory's `held/`, one empty file per
//! container the ledger names (a reservation or a ticket), and one file
//! `ledger-<inode>-<ctime>-<size>` that says for which ledger file, as written, the set is
//! complete. A stop stats the ledger, that file and the container's marker: three `stat`s.
//!
//! **Why it is safe.** A marker is created *before* the ledger that names its container is
//! renamed into place, and removed *after* the ledger that no longer names it is; the sync file
//! is written last, named for the new ledger file. So whenever the ledger at `ledger.json` has
//! its sync file, every container it names has a marker.
//!
//! **What the sync file vouches for.** Not the inode alone: ext4 hands a freed inode number to
//! the next new file within a few writes, and a write in place keeps it. The name also carries
//! the file's change time (`ctime`, to the nanosecond), which the kernel sets to the current
//! time on every write, rename, truncate or `chmod` of that inode and which no `touch` can set
//! back, and its size. Any other writer (a vramgate before markers, during an upgrade or after
//! a downgrade; `ledger repair`; an editor or `cat >` writing in place; a file put there by hand
//! that got a reused inode number) changes the change time, the stop finds no sync file for
//! what it sees, and falls back to reading the ledger, as before. Why not a token inside the
//! ledger: comparing it would take the read of the ledger that markers exist to avoid, and a
//! writer that keeps unknown fields (an older vramgate, an editor) would carry it along
//! unchanged. What is left (a write landing in the very clock tick of vramgate's rename, with
//! the same size) costs at most one skipped release, which the next transaction's reclaim makes
//! good (the container's init is gone). A marker left over (a writer killed between the rename
//! and the removal) only costs that fallback read.
//!
//! Markers are a cache: any error while keeping them drops the sync file (readers then read
//! the ledger) and never fails the transaction.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, mkdirat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::model::Ledger;
use super::store::c_name as c;

/// The subdirectory of the state directory that holds the markers.
pub const MARKS_DIR: &str = "held";
const SYNCED_PREFIX: &str = "ledger-";
const MARK_PREFIX: &str = "c-";

/// The marker's name for a container id: a hash, so any id (any length, any bytes) makes a
/// valid file name. Two ids with one hash share a marker: the stop of one then reads the
/// ledger, which is the answer without markers.
pub fn mark_name(container: &str) -> String {
    // FNV-1a, 64 bits: stable across versions and builds (std's hasher is not).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in container.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{MARK_PREFIX}{hash:016x}")
}

/// What a sync file vouches for: one ledger file as one write left it (see the module's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerId {
    inode: u64,
    ctime_sec: i64,
    ctime_nsec: i64,
    size: i64,
}

fn synced_name(id: LedgerId) -> String {
    format!(
        "{SYNCED_PREFIX}{}-{}.{:09}-{}",
        id.inode, id.ctime_sec, id.ctime_nsec, id.size
    )
}

/// The marker names a ledger needs: one per container it names.
pub fn wanted(ledger: &Ledger) -> BTreeSet<String> {
    ledger
        .reservations
        .iter()
        .map(|r| r.container_id.as_str())
        .chain(ledger.queue.iter().map(|t| t.container_id.as_str()))
        .map(mark_name)
        .collect()
}

/// Which ledger file is in `state`, as written, if there is one.
pub fn ledger_id(state: &File) -> Option<LedgerId> {
    let st = fstatat(
        state.as_fd(),
        c(super::LEDGER_FILE).as_c_str(),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .ok()?;
    Some(LedgerId {
        inode: st.st_ino,
        ctime_sec: st.st_ctime,
        ctime_nsec: st.st_ctime_nsec,
        size: st.st_size,
    })
}

/// The markers' directory, opened without following a link and checked to be root's and
/// closed to others (a state directory is; anything else is not trusted).
fn open_marks(state: &File, create: bool) -> Option<File> {
    let open = || {
        openat(
            state.as_fd(),
            c(MARKS_DIR).as_c_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    // Made once, by the first commit; every later one only opens it.
    let fd = match open() {
        Err(Errno::ENOENT) if create => {
            match mkdirat(state.as_fd(), c(MARKS_DIR).as_c_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => open().ok()?,
                Err(_) => return None,
            }
        }
        other => other.ok()?,
    };
    let dir = File::from(fd);
    let meta = dir.metadata().ok()?;
    (meta.uid() == 0 && meta.mode() & 0o077 == 0).then_some(dir)
}

fn exists(dir: &File, name: &str) -> bool {
    fstatat(dir.as_fd(), c(name).as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

fn create(dir: &File, name: &str) -> bool {
    let made = openat(
        dir.as_fd(),
        c(name).as_c_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::from_bits_truncate(0o600),
    );
    made.is_ok()
}

fn remove(dir: &File, name: &str) {
    let _ = unlinkat(dir.as_fd(), c(name).as_c_str(), UnlinkatFlags::NoRemoveDir);
}

/// Whether the markers say, for sure, that the ledger in `state` names no entry of
/// `container`. False whenever they cannot say (no markers for this ledger file, an error):
/// the caller then reads the ledger.
pub fn surely_not_held(state: &File, container: &str) -> bool {
    let Some(id) = ledger_id(state) else {
        // No ledger: nothing is held, which reading it would say too (and cheaply).
        return false;
    };
    let Some(dir) = open_marks(state, false) else {
        return false;
    };
    exists(&dir, &synced_name(id)) && !exists(&dir, &mark_name(container))
}

/// A commit in progress: markers for the new ledger made before it is written, the rest
/// after ([`MarksUpdate::after_write`]).
pub struct MarksUpdate {
    dir: Option<File>,
    old_id: Option<LedgerId>,
    /// Markers to remove once the new ledger is in place.
    stale: Vec<String>,
}

impl MarksUpdate {
    /// Before the new ledger is written: creates the markers it needs. When the markers were
    /// complete for the ledger being replaced, only the new containers' markers are made;
    /// otherwise the directory is listed and brought in line.
    pub fn before_write(state: &File, original: &Ledger, ledger: &Ledger) -> MarksUpdate {
        let old_id = ledger_id(state);
        let Some(dir) = open_marks(state, true) else {
            return MarksUpdate {
                dir: None,
                old_id,
                stale: Vec::new(),
            };
        };
        let want = wanted(ledger);
        let synced = old_id.is_some_and(|i| exists(&dir, &synced_name(i)));
        let present: BTreeSet<String> = if synced {
            wanted(original)
        } else {
            listed(&dir).unwrap_or_default()
        };
        let mut ok = true;
        for name in want.difference(&present) {
            ok &= create(&dir, name);
        }
        let mut stale: Vec<String> = present.difference(&want).cloned().collect();
        if !ok {
            // A marker is missing: no ledger may be declared complete until a full sync.
            if let Some(i) = old_id {
                remove(&dir, &synced_name(i));
            }
            return MarksUpdate {
                dir: None,
                old_id,
                stale,
            };
        }
        if !synced {
            // Other `ledger-*` files (a crash between writing one and removing the last; an
            // older vramgate's `ledger-<inode>`).
            stale.extend(
                listed_all(&dir)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|n| n.starts_with(SYNCED_PREFIX)),
            );
        }
        MarksUpdate {
            dir: Some(dir),
            old_id,
            stale,
        }
    }

    /// After the new ledger is in place: removes the markers it no longer needs and declares
    /// the set complete for the new ledger file.
    pub fn after_write(self, state: &File) {
        let Some(dir) = self.dir else { return };
        for name in &self.stale {
            remove(&dir, name);
        }
        if let Some(new) = ledger_id(state) {
            if Some(new) != self.old_id && create(&dir, &synced_name(new)) {
                if let Some(old) = self.old_id {
                    remove(&dir, &synced_name(old));
                }
            }
        }
    }
}

/// The markers in the directory (not the `ledger-*` files).
fn listed(dir: &File) -> Option<BTreeSet<String>> {
    Some(
        listed_all(dir)?
            .into_iter()
            .filter(|n| n.starts_with(MARK_PREFIX))
            .collect(),
    )
}

fn listed_all(dir: &File) -> Option<Vec<String>> {
    let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let entries = std::fs::read_dir(path).ok()?;
    Some(
        entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Reservation, StateDir};

    fn hold(dir: &StateDir, id: &str) {
        let mut tx = dir.begin().unwrap();
        tx.ledger.reservations.push(Reservation::for_test(id, "GPU-a", 1));
        let _ = tx.commit().unwrap();
    }

    fn drop_entry(dir: &StateDir, id: &str) {
        let mut tx = dir.begin().unwrap();
        tx.ledger.reservations.retain(|r| r.container_id != id);
        let _ = tx.commit().unwrap();
    }

    fn markers(dir: &StateDir) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join(MARKS_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(MARK_PREFIX))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn commits_keep_one_marker_per_named_container_and_say_for_which_ledger() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        // No ledger yet: the markers cannot say (reading nothing is cheap anyway).
        assert!(!dir.surely_not_held("a"));
        hold(&dir, "a");
        hold(&dir, "b");
        assert_eq!(markers(&dir), {
            let mut m = vec![mark_name("a"), mark_name("b")];
            m.sort();
            m
        });
        assert!(!dir.surely_not_held("a"));
        assert!(dir.surely_not_held("never-held"));
        drop_entry(&dir, "a");
        assert_eq!(markers(&dir), [mark_name("b")]);
        assert!(dir.surely_not_held("a"));
        // Exactly one `ledger-*` file, for the ledger in place.
        let synced: Vec<String> = std::fs::read_dir(dir.path().join(MARKS_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(SYNCED_PREFIX))
            .collect();
        assert_eq!(synced, [synced_name(ledger_id(dir_file(&dir)).unwrap())]);
    }

    fn dir_file(dir: &StateDir) -> &File {
        dir.dir_file()
    }

    /// A ledger written without markers (an older vramgate, `ledger repair`, by hand) is a new
    /// file: the markers say nothing of it until a commit brings them in line with it.
    #[test]
    fn a_ledger_written_without_markers_is_read_until_a_commit_syncs_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        hold(&dir, "a");
        let mut by_hand = dir.read().unwrap();
        by_hand.reservations[0].container_id = "x".into();
        by_hand.generation += 1;
        crate::atomic_file::replace(&dir.ledger_path(), &serde_json::to_vec(&by_hand).unwrap(), 0o600, None).unwrap();
        assert!(!dir.surely_not_held("x"), "x is held, and the markers do not know it");
        assert!(!dir.surely_not_held("a"), "nor can they say a is not");
        hold(&dir, "y");
        assert_eq!(markers(&dir), {
            let mut m = vec![mark_name("x"), mark_name("y")];
            m.sort();
            m
        });
        assert!(dir.surely_not_held("a"));
        assert!(!dir.surely_not_held("x"));
    }

    /// A write in place keeps the inode number (and ext4 gives a freed one to the next new
    /// file): the sync file vouches for the ledger as vramgate wrote it, not for whatever file
    /// has its inode now.
    #[test]
    fn a_ledger_rewritten_in_place_is_read_until_a_commit_syncs_them() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        hold(&dir, "a");
        let inode = std::fs::metadata(dir.ledger_path()).unwrap().ino();
        // A hand edit of the same size that keeps the generation, as an editor writing in
        // place would leave it; a person is never within the clock tick of vramgate's write.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut by_hand = dir.read().unwrap();
        by_hand.reservations[0].container_id = "x".into();
        std::fs::write(dir.ledger_path(), serde_json::to_vec(&by_hand).unwrap()).unwrap();
        assert_eq!(
            std::fs::metadata(dir.ledger_path()).unwrap().ino(),
            inode,
            "written in place"
        );
        assert!(!dir.surely_not_held("x"), "x is held, and the markers do not know it");
        hold(&dir, "y");
        assert!(!dir.surely_not_held("x"), "the commit brought the markers in line");
        assert!(dir.surely_not_held("a"));
    }

    #[test]
    fn names_are_stable_and_file_safe() {
        assert_eq!(mark_name(""), "c-cbf29ce484222325");
        assert_eq!(mark_name("a").len(), 18);
        assert!(!mark_name(&"/..".repeat(200)).contains('/'));
    }
}
