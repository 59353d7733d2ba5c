//! A durable set of keys with expiry times: the bundles the bridge has handed on, so a bundle
//! offered twice (hopd re-offers a file whose acknowledgement a crash lost; dtnd hands the same
//! bundle over again) is handed on once.
//!
//! One line per key, `<expiry, Unix seconds> <key>`, appended and flushed to disk
//! (`fdatasync`) before the bridge acknowledges what it took. Opening drops expired lines and
//! rewrites the file (temporary name, fsync, rename), so it holds only live keys; a torn last
//! line from a crash is skipped.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

pub struct Journal {
    path: PathBuf,
    file: File,
    keys: HashMap<String, u64>,
}

impl Journal {
    pub fn open(path: &Path, now_unix_s: u64) -> std::io::Result<Journal> {
        let mut keys = HashMap::new();
        match File::open(path) {
            Ok(f) => {
                for line in BufReader::new(f).lines() {
                    let Ok(line) = line else { break };
                    let Some((exp, key)) = line.split_once(' ') else {
                        continue;
                    };
                    let Ok(exp) = exp.parse::<u64>() else {
                        continue;
                    };
                    // The last line for a key wins (a removal is a line with expiry 0).
                    if !key.is_empty() {
                        keys.insert(key.to_string(), exp);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        keys.retain(|_, exp| *exp > now_unix_s);
        let mut text = String::new();
        for (k, exp) in &keys {
            text.push_str(&format!("{exp} {k}\n"));
        }
        crate::durable::write_durably(path, text.as_bytes())?;
        let file = OpenOptions::new().append(true).open(path)?;
        Ok(Journal {
            path: path.to_path_buf(),
            file,
            keys,
        })
    }

    /// Whether `key` is in the set and not expired.
    pub fn contains(&self, key: &str, now_unix_s: u64) -> bool {
        self.keys.get(key).is_some_and(|&exp| exp > now_unix_s)
    }

    /// Adds `key` until `expires_unix_s`, durably.
    pub fn insert(&mut self, key: &str, expires_unix_s: u64) -> std::io::Result<()> {
        // A key is one line; ids never hold line breaks, but the file's format must not
        // depend on that.
        let key = key.replace('\n', "%0A");
        self.file
            .write_all(format!("{expires_unix_s} {key}\n").as_bytes())?;
        self.file.sync_data()?;
        self.keys.insert(key, expires_unix_s);
        Ok(())
    }

    /// Removes `key`, durably.
    pub fn remove(&mut self, key: &str) -> std::io::Result<()> {
        self.insert(key, 0)?;
        self.keys.remove(key);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_survive_reopening_until_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seen");
        let mut j = Journal::open(&p, 100).unwrap();
        assert!(j.is_empty());
        j.insert("dtn://n1/-5-0", 200).unwrap();
        j.insert("3 dtn://n1/-6-0", 150).unwrap();
        assert!(j.contains("dtn://n1/-5-0", 100));
        assert!(!j.contains("dtn://n1/-5-0", 200));
        drop(j);
        let j = Journal::open(&p, 120).unwrap();
        assert_eq!(j.len(), 2);
        assert!(j.contains("3 dtn://n1/-6-0", 120));
        drop(j);
        // Past the second key's end it is dropped from the file as well.
        let mut j = Journal::open(&p, 160).unwrap();
        assert_eq!(j.len(), 1);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "200 dtn://n1/-5-0\n");
        // A removal holds across reopening.
        j.remove("dtn://n1/-5-0").unwrap();
        assert!(!j.contains("dtn://n1/-5-0", 160));
        drop(j);
        assert!(Journal::open(&p, 160).unwrap().is_empty());
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seen");
        std::fs::write(&p, "500 a\n500 b\n50").unwrap();
        let j = Journal::open(&p, 10).unwrap();
        assert_eq!(j.len(), 2);
        assert!(j.contains("a", 10) && j.contains("b", 10));
    }
}
