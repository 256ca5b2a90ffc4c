//! Build script: records the commit the binary is built from, for
//! `rollboard_build_info{commit}`. `ROLLBOARD_COMMIT` from the environment wins (the Docker
//! build passes it as a build argument, since its context has no `.git`); else
//! `git rev-parse --short HEAD` when git and the repository are at hand; else `unknown`.
//! It never fails the build.

use std::process::Command;

/// The trimmed stdout of `git args`, when git runs and succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_string()).filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ROLLBOARD_COMMIT");
    let given = std::env::var("ROLLBOARD_COMMIT")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let commit = given
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .filter(|s| s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric()))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ROLLBOARD_COMMIT={commit}");
    // A commit moves HEAD or the branch it names; the paths come from git so that a
    // worktree (whose `.git` is a file) is followed too.
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
        watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    for path in watched.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
