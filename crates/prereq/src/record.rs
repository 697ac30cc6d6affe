//! The record of tests skipped at run time, for `.ci/run`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file, in the target folder, that [`record_skip`] appends to.
pub const RECORD_FILE: &str = "udbtl-skipped.txt";

/// The record in the target folder whose `tmp` folder is `target_tmpdir`
/// (`CARGO_TARGET_TMPDIR`, `<target>/tmp`).
pub fn record_path(target_tmpdir: &Path) -> PathBuf {
    target_tmpdir
        .parent()
        .unwrap_or(target_tmpdir)
        .join(RECORD_FILE)
}

/// Prints `SKIPPED: <reason>` and appends `<test> (<binary>): <reason>` to
/// [`record_path`]`(target_tmpdir)`. Called through [`skipped!`].
///
/// The test is named by its thread (libtest runs each test on a thread
/// named after it), the binary by its file without cargo's hash. The line
/// is appended with one `write` on a file opened with `O_APPEND`, so test
/// binaries running at once never interleave their lines. A record that
/// cannot be written is said on stderr and does not fail the test.
///
/// [`skipped!`]: crate::skipped!
pub fn record_skip(target_tmpdir: &Path, reason: &str) {
    eprintln!("SKIPPED: {reason}");
    let current = std::thread::current();
    let test = current
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("(unnamed test)");
    let line = format!("{test} ({}): {}\n", binary(), reason.replace('\n', " "));
    let path = record_path(target_tmpdir);
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(err) = written {
        eprintln!(
            "(the skip could not be recorded in {}: {err})",
            path.display()
        );
    }
}

/// The running test binary's name without the `-<hash>` cargo adds.
fn binary() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            stem.to_owned()
        }
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_skip_is_one_line_in_the_target_folder() {
        let tmp = std::env::temp_dir().join(format!("udbtl-prereq-{}/tmp", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        record_skip(&tmp, "needs a\nthing");
        record_skip(&tmp, "needs another");
        let path = record_path(&tmp);
        assert_eq!(path.parent(), tmp.parent());
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].starts_with("record::tests::each_skip_is_one_line_in_the_target_folder (udbtl_prereq): needs a thing"),
            "{text}"
        );
        std::fs::remove_dir_all(tmp.parent().unwrap()).unwrap();
    }
}
