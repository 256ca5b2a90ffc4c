//! The `rollboard` binary run as a command: with or without a config file, and its output as text.

use std::path::Path;
use std::process::{Command, Output};

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
