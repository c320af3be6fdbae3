//! Stopping and restarting a component of the local cluster (`e2e/cluster/up`): the chaos
//! suite's "kube-apiserver restarted" and "kubelet stopped".
//!
//! `e2e/cluster/up` starts each component detached, with its pid in
//! `$COJOB_E2E_STATE/run/<name>.pid` and its output appended to `$COJOB_E2E_LOGS/<name>.log`.
//! [`Component::stop`] captures the process's command line and environment from `/proc` and
//! kills it; [`Stopped::start`] starts the same command again the same way and rewrites the pid
//! file, so `e2e/cluster/down` still finds it.

use anyhow::{Context, anyhow, bail};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

fn state_dir() -> PathBuf {
    std::env::var_os("COJOB_E2E_STATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/lib/cojob-e2e"))
}

fn logs_dir() -> PathBuf {
    std::env::var_os("COJOB_E2E_LOGS")
        .map(PathBuf::from)
        .unwrap_or_else(|| state_dir().join("logs"))
}

/// A running component of the local cluster, named as in its pid file.
#[derive(Debug, Clone)]
pub struct Component {
    name: String,
}

/// A component that [`Component::stop`] stopped, with what it takes to start it again.
#[derive(Debug)]
pub struct Stopped {
    name: String,
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl Component {
    /// `name` as in `e2e/cluster/lib.sh`'s `E2E_COMPONENTS` (`kube-apiserver`, `kubelet`, …).
    pub fn new(name: &str) -> Component {
        Component { name: name.into() }
    }

    fn pid_file(&self) -> PathBuf {
        state_dir().join("run").join(format!("{}.pid", self.name))
    }

    /// The live process of the component.
    pub fn pid(&self) -> anyhow::Result<i32> {
        let file = self.pid_file();
        let pid: i32 = std::fs::read_to_string(&file)
            .with_context(|| format!("{}: is the local cluster up?", file.display()))?
            .trim()
            .parse()
            .with_context(|| format!("{}: not a pid", file.display()))?;
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            bail!("{} (pid {pid}) is not running", self.name);
        }
        Ok(pid)
    }

    /// Kills the component with `signal` (`-TERM`, `-KILL`), waits up to 30 s for it to exit,
    /// and returns how to start it again.
    pub async fn stop(&self, signal: &str) -> anyhow::Result<Stopped> {
        let pid = self.pid()?;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let argv: Vec<OsString> = std::fs::read(proc_dir.join("cmdline"))?
            .split(|b| *b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| OsString::from_vec(w.to_vec()))
            .collect();
        let env = std::fs::read(proc_dir.join("environ"))?
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let eq = kv.iter().position(|b| *b == b'=')?;
                Some((
                    OsString::from_vec(kv[..eq].to_vec()),
                    OsString::from_vec(kv[eq + 1..].to_vec()),
                ))
            })
            .collect();
        if argv.is_empty() {
            bail!("{} (pid {pid}) has no command line", self.name);
        }
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill {signal} {pid} ({}) failed", self.name);
        }
        // Gone, or a zombie with no other thread left: a dying process loses its memory (and
        // its command line) before its files, and its main thread turns zombie while its other
        // threads may still hold the shared file table; only then are its sockets closed.
        let exited = || {
            let zombie =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                    stat.rsplit(')')
                        .next()
                        .is_some_and(|rest| rest.trim_start().starts_with(['Z', 'X']))
                });
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count);
            zombie && threads <= 1
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !exited() {
            if tokio::time::Instant::now() > deadline {
                return Err(anyhow!(
                    "{} (pid {pid}) did not exit within 30 s",
                    self.name
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Stopped {
            name: self.name.clone(),
            argv,
            env,
        })
    }
}

impl Stopped {
    /// Starts the component again with its old command line and environment, detached in a
    /// session of its own, output appended to its log; returns the new pid.
    pub fn start(self) -> anyhow::Result<i32> {
        let log_path = logs_dir().join(format!("{}.log", self.name));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| log_path.display().to_string())?;
        let child = std::process::Command::new("setsid")
            .args(&self.argv)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {} again", self.name))?;
        let pid = i32::try_from(child.id())?;
        let pid_file = state_dir().join("run").join(format!("{}.pid", self.name));
        std::fs::write(&pid_file, format!("{pid}\n"))?;
        // Reap it if it exits while the test still runs; the cluster scripts own it otherwise.
        std::thread::spawn(move || {
            let mut child = child;
            let _ = child.wait();
        });
        Ok(pid)
    }
}
