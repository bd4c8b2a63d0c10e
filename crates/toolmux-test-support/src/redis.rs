//! A real `redis-server` for tests: [`RedisServer::start`] runs one on a free loopback
//! port, without persistence, and kills it when dropped.
//!
//! `redis-server` must be on `PATH`; `.ci/install-peers` installs it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer its first `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Ports tried before giving up (another process may take a free port before the server).
const ATTEMPTS: usize = 5;

/// A `redis-server` child process on `127.0.0.1`, killed and reaped on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    password: Option<String>,
}

impl RedisServer {
    /// Starts a server without a password. Panics, with a hint to run `.ci/install-peers`,
    /// when `redis-server` is missing, and when it does not answer within 10 s.
    pub fn start() -> RedisServer {
        RedisServer::launch(None)
    }

    /// Starts a server that requires `password` (`--requirepass`).
    pub fn start_with_password(password: &str) -> RedisServer {
        RedisServer::launch(Some(password.to_owned()))
    }

    fn launch(password: Option<String>) -> RedisServer {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let port = free_port();
            let mut command = Command::new("redis-server");
            command
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
                // Nothing is written (no persistence), but a server needs a directory.
                .arg("--dir")
                .arg(std::env::temp_dir())
                .current_dir(std::env::temp_dir())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(password) = &password {
                command.args(["--requirepass", password]);
            }
            let child = match command.spawn() {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                    "redis-server is not on PATH: run .ci/install-peers (it installs it with apt-get)"
                ),
                Err(e) => panic!("cannot start redis-server: {e}"),
            };
            let mut server = RedisServer { child: Some(child), port, password: password.clone() };
            match server.wait_until_ready() {
                Ok(()) => return server,
                // Most likely the port was taken in between: try another.
                Err(why) => last = why,
            }
        }
        panic!("redis-server did not start in {ATTEMPTS} attempts: {last}")
    }

    fn wait_until_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let pid = self.child.as_ref().map_or(0, Child::id);
            if answers(self.port, pid, self.password.as_deref()) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("redis-server on port {} exited with {status}", self.port));
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!("redis-server on port {} did not answer PING", self.port));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`, with the password when there is one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// Kills the server and reaps it (as a crash would end it); dropping does the same.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a loopback port")
}

/// Whether the server on `port` answers and is process `pid` (and not another test's
/// server that took the port first): `INFO server` tells its process id.
fn answers(port: u16, pid: u32, password: Option<&str>) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut request = Vec::new();
    if let Some(password) = password {
        request.extend_from_slice(
            format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{password}\r\n", password.len()).as_bytes(),
        );
    }
    request.extend_from_slice(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n");
    if stream.write_all(&request).is_err() {
        return false;
    }
    let wanted = format!("process_id:{pid}\r\n");
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while reply.len() < 64 * 1024 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return false,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
        let text = String::from_utf8_lossy(&reply);
        if text.contains(&wanted) {
            return true;
        }
        if text.contains("process_id:") || text.starts_with('-') || text.contains("\r\n-") {
            return false;
        }
    }
    false
}
