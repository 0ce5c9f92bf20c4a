//! The offline check behind `shopfloor validate FILE…`: parse each file and print its
//! problems as `FILE:LINE:COL: message`, one a line, as compilers do so editors can jump, or
//! `ok FILE` for a file that is a valid workflow.

use std::io::Write;
use std::path::PathBuf;

use super::parse::{Problem, parse};

/// Validates each file; returns true when every one is a valid workflow.
pub fn validate_files(paths: &[PathBuf], out: &mut impl Write) -> bool {
    let mut all_valid = true;
    for path in paths {
        let problems = match std::fs::read_to_string(path) {
            Ok(source) => parse(&source).err().unwrap_or_default(),
            Err(e) => vec![Problem { line: 1, col: 1, path: String::new(), message: format!("cannot read the file: {e}") }],
        };
        all_valid &= problems.is_empty();
        if problems.is_empty() {
            let _ = writeln!(out, "ok {}", path.display());
        }
        for problem in &problems {
            // A failed write (a closed pipe) must not turn into a verdict on the workflow,
            // which the return value gives either way.
            let _ = writeln!(out, "{}:{}:{}: {problem}", path.display(), problem.line, problem.col);
        }
    }
    all_valid
}
