//! The `rollboard` binary run as a command: with or without a config file, and its output as text.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

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

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

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
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn send");
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

pub fn rollboard_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rollboard"));
    cmd.env_remove("ROLLBOARD_CONFIG");
    cmd
}
