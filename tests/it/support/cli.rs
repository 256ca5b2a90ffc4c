//! The `rollboard` binary run as a command: with or without a config file, and its output as text.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// Runs the `rollboard` binary with `--config config` and `args`, ignoring any
/// `ROLLBOARD_CONFIG` of the test's environment.
pub fn run_rollboard(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_rollboard"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env_remove("ROLLBOARD_CONFIG")
        .output()
        .expect("run rollboard")
}

/// `rollboard` with an optional `--config`, `args` and extra environment; its output.
pub fn rollboard(config: Option<&Path>, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollboard"));
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.args(args).env_remove("ROLLBOARD_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run rollboard")
}

/// A command's stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A command's stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Bytes as text, invalid UTF-8 replaced.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `rollboard send` (stdin when `file` is None) and returns (exit code, stdout, stderr).
pub fn send(config: &std::path::Path, file: Option<&std::path::Path>, input: &[u8]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollboard"));
    cmd.env_remove("ROLLBOARD_CONFIG")
        .arg("--config")
        .arg(config)
        .arg("send");
    if let Some(file) = file {
        cmd.arg(file);
    }
    let mut child = cmd.spawn_piped("spawn send");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    // The child may stop reading at an over-long line; a broken pipe is fine then.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("send");
    let _ = writer.join();
    out
}

/// Fails the test unless `out` exited with `code`, showing `what` and stderr.
pub fn assert_exit(out: &Output, code: i32, what: &str) {
    assert_eq!(out.status.code(), Some(code), "{what}: {}", stderr(out));
}

/// Fails the test unless `text` contains `needle`, showing the text.
pub fn assert_contains(text: &str, needle: &str) {
    assert!(text.contains(needle), "{text}");
}

/// For each `(text, key)`, `rollboard top r` on `text` written to `path` exits 64 naming `key`.
pub fn assert_configs_refused_naming(path: &Path, cases: &[(&str, &str)]) {
    for (text, key) in cases {
        std::fs::write(path, text).expect("write");
        let out = rollboard(Some(path), &["top", "r"], &[]);
        assert_eq!(out.status.code(), Some(64), "{key}");
        assert_contains(&stderr(&out), key);
    }
}

/// Fails the test unless `out` exited 0, showing `what`, stdout and stderr.
pub fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `rollboard --config <config> send <file>`, which must succeed; its output.
pub fn send_file(config: &Path, file: &Path) -> Output {
    let out = run_rollboard(config, &["send", file.to_str().expect("utf-8 path")]);
    assert_success(&out, "send");
    out
}

/// Spawning a command with stdin, stdout and stderr all piped.
pub trait SpawnPiped {
    /// Spawns with every standard stream piped; `what` names the command if that fails.
    fn spawn_piped(&mut self, what: &str) -> Child;
}

impl SpawnPiped for Command {
    fn spawn_piped(&mut self, what: &str) -> Child {
        self.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect(what)
    }
}

/// Asserts that the report of `drop-board` (its stdout, in `out`) says it deleted all of
/// `doomed` keys.
pub fn assert_deleted_all(out: &Output, doomed: usize) {
    let report = stdout(out);
    let all = format!("deleted {doomed} of {doomed} key(s)");
    assert!(report.contains(&all), "{report}");
}
