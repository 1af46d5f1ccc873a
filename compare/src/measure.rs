//! What a cell measures besides time: latency percentiles, bytes written to and flushes of the
//! data directory's block device (`/proc/diskstats`), and busy CPU time (`/proc/stat`).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The `p`-th percentile (0..=100) of sorted `values`, nearest-rank: the smallest value with at
/// least `p` % of the values at or below it. `None` if there are none.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    // The tolerance keeps 99.9 % of 1000 at rank 999 despite binary floating point.
    let exact = p / 100.0 * sorted.len() as f64;
    let rank = (exact - exact * 1e-12).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p99 and p99.9 of `values` (sorted in place), in nanoseconds.
pub fn summarize(values: &mut [u64]) -> Option<[u64; 3]> {
    values.sort_unstable();
    Some([
        percentile(values, 50.0)?,
        percentile(values, 99.0)?,
        percentile(values, 99.9)?,
    ])
}

/// The block device a path lives on, as `/proc/diskstats` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
    /// Kernel name (`vda`, `nvme0n1p2`, ...).
    pub name: String,
}

/// Splits a Linux `dev_t` into major and minor numbers.
fn split_dev(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

impl Device {
    /// The device holding `path` (the partition, if it is on one): its `st_dev` matched against
    /// `/sys/dev/block/MAJ:MIN`. An error if it is not a block device (tmpfs, overlay, btrfs
    /// subvolumes report anonymous device numbers).
    pub fn of(path: &Path) -> Result<Device, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let (major, minor) = split_dev(meta.dev());
        let link = format!("/sys/dev/block/{major}:{minor}");
        let target = std::fs::canonicalize(&link).map_err(|_| {
            format!(
                "{} is on {major}:{minor}, not a block device",
                path.display()
            )
        })?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| format!("{link} has no name"))?;
        Ok(Device { major, minor, name })
    }

    /// The device's counters now.
    pub fn stats(&self) -> Result<DiskStats, String> {
        let text = std::fs::read_to_string("/proc/diskstats").map_err(|e| e.to_string())?;
        parse_diskstats(&text, self.major, self.minor)
            .ok_or_else(|| format!("{} not in /proc/diskstats", self.name))
    }
}

/// The counters of one `/proc/diskstats` line the harness uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiskStats {
    /// Sectors (512 bytes, whatever the device's sector size) written.
    pub sectors_written: u64,
    /// Flush requests completed (kernel 5.5 and later; `None` before).
    pub flushes: Option<u64>,
}

/// The line for `major:minor` of a `/proc/diskstats` text.
pub fn parse_diskstats(text: &str, major: u64, minor: u64) -> Option<DiskStats> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        if num(0)? != major || num(1)? != minor {
            return None;
        }
        // After major, minor and name: reads (4 fields), writes (4: completed, merged,
        // sectors, ms), in flight, io ms, weighted ms, discards (4), flushes, flush ms.
        Some(DiskStats {
            sectors_written: num(9)?,
            flushes: num(18),
        })
    })
}

/// System-wide busy CPU time, in clock ticks: user + nice + system + irq + softirq + steal of
/// the `cpu` line of `/proc/stat`. Every process counts, servers and harness alike.
pub fn busy_ticks() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/stat").map_err(|e| e.to_string())?;
    parse_busy_ticks(&text).ok_or_else(|| "no cpu line in /proc/stat".into())
}

/// The busy ticks of a `/proc/stat` text.
pub fn parse_busy_ticks(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    Some(f.first()? + f.get(1)? + f.get(2)? + f.get(5)? + f.get(6)? + f.get(7).unwrap_or(&0))
}

/// CPU ticks (user + system, all threads) used so far by this process, by the processes
/// `children` (a multi-process cell's children, other instances of this harness: counted by
/// PID, not by name, so that another harness running on the machine is not counted) and by
/// every process whose name starts with one of `servers` (`postgres`, `redis`): the CPU the
/// measured systems themselves use, as opposed to anything else running on the machine. A
/// process counts only while `/proc` lists it: the children stay alive until the parent has
/// sampled the window's end.
pub fn own_ticks(servers: &[&str], children: &[u32]) -> u64 {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let (comm, ticks) = parse_pid_stat(&stat)?;
        (pid == me || children.contains(&pid) || servers.iter().any(|s| comm.starts_with(s)))
            .then_some(ticks)
    })
    .sum()
}

/// The command name and user + system ticks of a `/proc/PID/stat` text.
pub fn parse_pid_stat(text: &str) -> Option<(&str, u64)> {
    // The name is in parentheses and may itself hold spaces or parentheses.
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?;
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // After the name: state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt, majflt,
    // cmajflt, utime, stime.
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// The share (0..=1) of the machine's CPU capacity used by anything but this process and the
/// `servers` over the next `over`.
pub fn others_busy(over: std::time::Duration, servers: &[&str], tps: u64, cpus: usize) -> f64 {
    let (b0, o0) = (busy_ticks().unwrap_or(0), own_ticks(servers, &[]));
    std::thread::sleep(over);
    let (b1, o1) = (busy_ticks().unwrap_or(0), own_ticks(servers, &[]));
    let others = (b1.saturating_sub(b0)).saturating_sub(o1.saturating_sub(o0));
    others as f64 / (over.as_secs_f64() * tps as f64 * cpus.max(1) as f64)
}

/// Clock ticks per second (`getconf CLK_TCK`), 100 if that cannot be asked.
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 50.0), Some(500));
        assert_eq!(percentile(&v, 99.0), Some(990));
        assert_eq!(percentile(&v, 99.9), Some(999));
        assert_eq!(percentile(&v, 100.0), Some(1000));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[7], 99.9), Some(7));
        assert_eq!(percentile(&[], 50.0), None);
        let mut few = vec![30, 10, 20];
        assert_eq!(summarize(&mut few), Some([20, 30, 30]));
    }

    #[test]
    fn diskstats_line_is_found_by_number() {
        let text = "   7       0 loop0 1 0 2 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n \
                    254       0 vda 6230 3099 1813122 10255 1216 16912 1077488 4629 0 2580 \
                    15244 3464 25 41672 356 25 1\n";
        let s = parse_diskstats(text, 254, 0).unwrap();
        assert_eq!(s.sectors_written, 1_077_488);
        assert_eq!(s.flushes, Some(25));
        assert_eq!(parse_diskstats(text, 254, 1), None);
        // An old kernel without the discard and flush fields.
        let old = "8 1 sda1 1 2 3 4 5 6 77 8 9 10 11\n";
        assert_eq!(
            parse_diskstats(old, 8, 1),
            Some(DiskStats {
                sectors_written: 77,
                flushes: None
            })
        );
    }

    #[test]
    fn busy_ticks_skip_idle_and_iowait() {
        let text = "cpu  10 1 5 1000 50 2 3 4 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(parse_busy_ticks(text), Some(10 + 1 + 5 + 2 + 3 + 4));
    }

    #[test]
    fn pid_stat_names_may_hold_spaces_and_parentheses() {
        let text = "4242 (redis-server (x)) S 1 4242 4242 0 -1 4194560 1 0 0 0 17 5 0 0 20 0";
        assert_eq!(parse_pid_stat(text), Some(("redis-server (x)", 22)));
    }

    #[test]
    fn dev_numbers_split_like_glibc() {
        assert_eq!(split_dev((254 << 8) | 1), (254, 1));
        assert_eq!(split_dev((259 << 8) | (3 << 20) | 5), (259, (3 << 8) | 5));
    }
}
