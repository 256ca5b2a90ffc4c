//! A redis-server with extra arguments (the shipped ACL file, TLS), killed on drop, and the
//! URL of the ACL user the deploy files ship.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rollboard::domain::board::Board;
use rollboard::store::{Reconnect, Store};

use crate::support::env::script_calls;
use crate::support::keys::{dead_letter_stream, intake_stream};
use crate::support::redis::{free_port, RedisServer};

/// The password the tests give the ACL user; it must never show in a log or an error.
pub const PASSWORD: &str = "s3cret-acl-password-7Qx";

/// A redis-server started with extra arguments (ACL file, TLS), killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts redis-server on a free loopback port with `args`; `tls` serves TLS only.
    pub fn start(args: &[String], tls: bool) -> Server {
        for _ in 0..20 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let mut cmd = Command::new("redis-server");
            if tls {
                cmd.args(["--port", "0", "--tls-port", &port.to_string()]);
            } else {
                cmd.args(["--port", &port.to_string()]);
            }
            let child = cmd
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(args)
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut server = Server {
                child,
                port,
                _dir: dir,
            };
            if server.wait_listening() {
                return server;
            }
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        panic!("could not start redis-server");
    }

    fn wait_listening(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shipped ACL file with the placeholder hash replaced by [`PASSWORD`]'s, each rule in
/// `drop` removed.
pub fn acl_file(dir: &Path, drop: &[&str]) -> PathBuf {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/redis/users.acl"
    ))
    .expect("deploy/redis/users.acl");
    let hash = Command::new("sh")
        .args(["-c", &format!("printf %s '{PASSWORD}' | sha256sum")])
        .output()
        .expect("sha256sum");
    let hash = String::from_utf8_lossy(&hash.stdout)
        .split_whitespace()
        .next()
        .expect("a hash")
        .to_string();
    let mut text = shipped.replace(&format!("#{}", "0".repeat(64)), &format!("#{hash}"));
    assert!(
        text.contains(&hash),
        "the shipped file has the placeholder hash"
    );
    for rule in drop {
        let with_space = format!(" {rule} ");
        assert!(text.contains(&with_space), "{rule} is in the ACL file");
        text = text.replacen(&with_space, " ", 1);
    }
    let path = dir.join("users.acl");
    std::fs::write(&path, text).expect("write acl");
    path
}

/// A redis-server running the shipped ACL file, each rule in `drop` removed.
pub fn acl_server(dir: &Path, drop: &[&str]) -> Server {
    let acl = acl_file(dir, drop);
    Server::start(&["--aclfile".to_string(), acl.display().to_string()], false)
}

/// The URL of the shipped ACL user on `server`.
pub fn acl_url(server: &Server) -> String {
    format!("redis://rollboard:{PASSWORD}@127.0.0.1:{}", server.port)
}

/// A store connected to `redis` as the user `user` (password `<user>-pw`, created here),
/// who may run every command on the keys matching `patterns` (ACL `~` rules) alone.
pub async fn store_as(redis: &RedisServer, user: &str, patterns: &[&str]) -> Store {
    let password = format!(">{user}-pw");
    let mut acl = vec!["ACL", "SETUSER", user, "on", &password, "resetkeys"];
    acl.extend(patterns);
    acl.push("+@all");
    assert_eq!(redis.cli(&acl).trim(), "OK");
    let url = format!("redis://{user}:{user}-pw@127.0.0.1:{}", redis.port);
    Store::connect(&url, "rb", 1, Reconnect::Never)
        .await
        .expect("connect")
        .with_script_calls(script_calls())
}

/// The permissions `store`'s user lacks for `board`, as the daemon's start-up check finds
/// them.
pub async fn denied(store: &Store, board: &Board) -> Vec<String> {
    store
        .check_permissions(
            std::slice::from_ref(board),
            intake_stream(),
            dead_letter_stream(),
        )
        .await
        .expect("check")
}
