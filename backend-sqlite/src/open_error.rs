//! Why a database file would not open, in the operating system's words.
//!
//! SQLite says only "unable to open database file" (code 14), whatever the cause: a
//! missing folder, a file or folder without write permission (WAL mode also creates
//! `<file>-wal` and `<file>-shm` beside it), a path that is a folder. This asks the
//! operating system the same questions and names the path and the answer.

use std::{
    fs::OpenOptions,
    io,
    path::{Path, PathBuf},
};

use relayq_core::Error;

/// SQLite's primary result code for "cannot open".
const SQLITE_CANTOPEN: u32 = 14;

/// Whether `e` is SQLite's "cannot open" (any extended code of it).
pub(crate) fn cannot_open(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<u32>().ok())
            .is_some_and(|code| code & 0xff == SQLITE_CANTOPEN),
        _ => false,
    }
}

/// The error for a database at `path` that SQLite could not open.
pub(crate) fn explain(path: &Path) -> Error {
    Error::backend(format!("{}: {}", path.display(), reason(path)))
}

fn reason(path: &Path) -> String {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match std::fs::metadata(&dir) {
        Err(e) => return format!("folder {}: {}", dir.display(), os(&e)),
        Ok(m) if !m.is_dir() => return format!("{} is not a folder", dir.display()),
        Ok(_) => {}
    }
    if path.is_dir() {
        return "it is a folder, not a file".to_owned();
    }
    let existed = path.exists();
    if let Err(e) = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        return os(&e);
    }
    if !existed {
        // The probe made an empty file where SQLite could not: leave nothing behind.
        let _ = std::fs::remove_file(path);
    }
    // The file opens: then WAL mode's companion files cannot be made in the folder.
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    if !wal.exists() {
        match OpenOptions::new().write(true).create_new(true).open(&wal) {
            Ok(_) => {
                let _ = std::fs::remove_file(&wal);
            }
            Err(e) => {
                return format!(
                    "the file opens, but {} cannot be made beside it (WAL mode needs it): {}",
                    wal.display(),
                    os(&e)
                );
            }
        }
    }
    "SQLite could not open it (code 14), though the operating system can".to_owned()
}

/// `Permission denied`, without Rust's "(os error 13)".
fn os(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_folder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no/such/folder/q.db");
        let text = explain(&path).to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("No such file or directory"), "{text}");
    }

    #[test]
    fn a_folder_in_place_of_the_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let text = explain(dir.path()).to_string();
        assert!(text.contains("is a folder"), "{text}");
    }
}
