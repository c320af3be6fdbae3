//! What the machine's processes cost: CPU seconds and resident memory of the cojob controller,
//! kube-controller-manager and the components both kinds share, from `/proc` (the cluster runs
//! on this machine).

use std::collections::BTreeSet;

/// CPU seconds and resident bytes of the processes whose arguments satisfy `is_it` (the
/// cluster runs on this machine, so its processes are in this `/proc`).
pub fn process_cost(is_it: impl Fn(&[String]) -> bool) -> (f64, u64) {
    let ticks_per_second = 100.0; // USER_HZ on Linux
    let (mut cpu, mut rss) = (0.0, 0);
    for path in matching(is_it) {
        if let Ok(stat) = std::fs::read_to_string(path.join("stat"))
            && let Some((_, rest)) = stat.rsplit_once(')')
        {
            // proc(5): after the command come state (3), …, utime (14) and stime (15).
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let stime: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
            cpu += (utime + stime) / ticks_per_second;
        }
        if let Ok(status) = std::fs::read_to_string(path.join("status")) {
            rss += status_bytes(&status, "VmRSS:");
        }
    }
    (cpu, rss)
}

/// Resident bytes (`VmRSS`) and peak resident bytes (`VmHWM`) of the processes whose arguments
/// satisfy `is_it`, summed.
pub fn process_memory(is_it: impl Fn(&[String]) -> bool) -> (u64, u64) {
    let (mut rss, mut peak) = (0, 0);
    for path in matching(is_it) {
        if let Ok(status) = std::fs::read_to_string(path.join("status")) {
            rss += status_bytes(&status, "VmRSS:");
            peak += status_bytes(&status, "VmHWM:");
        }
    }
    (rss, peak)
}

/// A size field of `/proc/<pid>/status` (`VmRSS:`, given in kB), in bytes; 0 if absent.
fn status_bytes(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The `/proc/<pid>` directories of the processes whose arguments satisfy `is_it`.
fn matching(is_it: impl Fn(&[String]) -> bool) -> Vec<std::path::PathBuf> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            std::fs::read(path.join("cmdline")).is_ok_and(|cmd| {
                let argv: Vec<String> = cmd
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                is_it(&argv)
            })
        })
        .collect()
}

/// Which processes match `is_it`: each one's pid and start time (clock ticks since boot, field
/// 22 of `/proc/<pid>/stat`), so a process that was restarted, even under the same pid, is
/// told apart.
pub fn process_identity(is_it: impl Fn(&[String]) -> bool) -> BTreeSet<(String, String)> {
    matching(is_it)
        .into_iter()
        .filter_map(|path| {
            let stat = std::fs::read_to_string(path.join("stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let start = rest.split_whitespace().nth(19)?.to_owned();
            let pid = path.file_name()?.to_string_lossy().into_owned();
            Some((pid, start))
        })
        .collect()
}

/// `cojob controller`, as the chart runs it.
pub fn is_cojob_controller(argv: &[String]) -> bool {
    argv.first()
        .is_some_and(|a| a.ends_with("/cojob") || a == "cojob")
        && argv.get(1).is_some_and(|a| a == "controller")
}

/// kube-controller-manager (its CronJob controller runs inside it, with every other one).
pub fn is_kube_controller_manager(argv: &[String]) -> bool {
    is_program(argv, "kube-controller-manager")
}

/// The API server, etcd, the scheduler and kwok: what both kinds share.
pub fn is_shared_component(argv: &[String]) -> bool {
    ["kube-apiserver", "etcd", "kube-scheduler", "kwok"]
        .iter()
        .any(|p| is_program(argv, p))
}

/// True when `argv[0]`'s file name starts with `program` (the cluster's binaries carry their
/// version: `kube-apiserver-v1.34.12`).
fn is_program(argv: &[String], program: &str) -> bool {
    argv.first().is_some_and(|a| {
        a.rsplit('/')
            .next()
            .is_some_and(|b| b == program || b.starts_with(&format!("{program}-")))
    })
}

/// The machine's busy and total CPU time so far, in seconds (`/proc/stat`).
pub fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0);
    };
    let f: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: f64 = f.iter().take(8).sum();
    // idle (4th) and iowait (5th) are not busy.
    let idle = f.get(3).copied().unwrap_or(0.0) + f.get(4).copied().unwrap_or(0.0);
    ((total - idle) / 100.0, total / 100.0)
}
