//! What the figures were measured on.

use std::path::Path;

/// The machine and the data directory's storage.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Logical CPUs.
    pub cpus: usize,
    /// The CPU model name.
    pub cpu_model: String,
    /// Total memory, from `/proc/meminfo`.
    pub memory: String,
    /// The kernel release (`uname -r`).
    pub kernel: String,
    /// The data directory's filesystem type and mount point.
    pub filesystem: String,
}

impl Machine {
    /// Describes this machine and the filesystem holding `data_dir`.
    pub fn describe(data_dir: &Path) -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpuinfo = read("/proc/cpuinfo");
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or_else(|| "unknown".into(), |(_, v)| v.trim().to_string());
        let memory = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().strip_suffix(" kB")?.trim().parse::<u64>().ok())
            .map_or_else(
                || "unknown".into(),
                |kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0),
            );
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            cpu_model,
            memory,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            filesystem: filesystem_of(data_dir, &read("/proc/mounts")).map_or_else(
                || "unknown".into(),
                |(ty, at)| format!("{ty} (mounted at {at})"),
            ),
        }
    }

    /// Whether the data directory is on a memory-backed filesystem, where fsync is free.
    pub fn on_memory(&self) -> bool {
        ["tmpfs", "ramfs"]
            .iter()
            .any(|t| self.filesystem.starts_with(&format!("{t} ")))
    }
}

/// The type and mount point of the filesystem `path` is on: the longest mount point that is a
/// prefix of its canonical path.
pub fn filesystem_of(path: &Path, mounts: &str) -> Option<(String, String)> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, at, ty) = (f.next()?, f.next()?, f.next()?);
            // Mount points escape spaces as \040.
            let at = at.replace("\\040", " ");
            path.starts_with(&at).then(|| (ty.to_string(), at))
        })
        .max_by_key(|(_, at)| at.len())
}

#[cfg(test)]
mod tests {
    use super::filesystem_of;
    use std::path::Path;

    #[test]
    fn the_longest_mount_prefix_wins() {
        let mounts = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n\
                      /dev/vdb /work/data xfs rw 0 0\n";
        let fs = |p| filesystem_of(Path::new(p), mounts).map(|(t, _)| t);
        assert_eq!(fs("/nonexistent/dev/shm/x").as_deref(), Some("ext4"));
        assert_eq!(fs("/work/data/x").as_deref(), Some("xfs"));
        assert_eq!(fs("/work/database").as_deref(), Some("ext4"));
    }
}
