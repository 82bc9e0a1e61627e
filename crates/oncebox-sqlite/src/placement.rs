//! Which CPU the writer and checkpoint threads are kept on: by default the one that takes the
//! database disk's interrupts, where a single CPU takes them all.
//!
//! Why: every commit ends in an fsync, and the writer sleeps until the disk's completion
//! interrupt wakes it. A device with one request queue (virtio-blk on small VMs, many SATA
//! controllers) raises that interrupt on one CPU; a writer running elsewhere is woken by an
//! inter-processor interrupt, and on a VM whose idle CPUs halt, through the host. Kept on the
//! interrupt's CPU, it is woken where the interrupt lands and, at its raised priority, runs
//! at once. The checkpointer's reads, writes and syncs go to the same disk and are kept there
//! too; it then also runs only while the writer waits. Measured with the gateway benchmark on
//! a two-core VM, alternating runs: `COMMIT` 0.45–0.58 → 0.40–0.43 ms in most runs, new
//! events 0.40 → 0.44 of the baseline (medians of 22 and 20 runs). Either thread kept there
//! alone, or both on the other CPU, gained nothing clear.
//!
//! A device that spreads its interrupts (one queue per CPU, as NVMe does) completes a request
//! on the CPU that submitted it, wherever the writer runs: then nothing is pinned. Nor is it
//! for a file on a device without interrupts of its own (tmpfs, device-mapper, network file
//! systems), or outside Linux. Several stores on one such disk in one process share its CPU:
//! their commits queue for that disk anyway.

use std::path::Path;

/// Where the writer and checkpoint threads run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// On the CPU that took at least nine in ten of the database disk's interrupts since boot,
    /// if there is one, they are all routed there now and the process may run there;
    /// otherwise where the scheduler puts them.
    #[default]
    DiskInterrupts,
    /// Where the scheduler puts them.
    Anywhere,
    /// On this CPU (numbered as the kernel does). Refused by the kernel, it changes nothing.
    Cpu(usize),
}

/// The CPU `placement` names for a store whose file is `path`, if any.
pub(crate) fn cpu_for(placement: Placement, path: &Path) -> Option<usize> {
    match placement {
        Placement::Anywhere => None,
        Placement::Cpu(cpu) => Some(cpu),
        Placement::DiskInterrupts => disk_interrupt_cpu(path),
    }
}

#[cfg(target_os = "linux")]
fn disk_interrupt_cpu(path: &Path) -> Option<usize> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let device = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let irqs = device_irqs(&device);
    if irqs.is_empty() {
        return None;
    }
    let taken = taken(&std::fs::read_to_string("/proc/interrupts").ok()?, &irqs)?;
    let cpu = taken.one_cpu()?;
    // The counts run since boot: an interrupt moved since (by irqbalance, say) must not keep
    // the threads where it no longer lands, so every line that fired must be routed there now.
    let moved = taken.fired.iter().any(|irq| {
        std::fs::read_to_string(format!("/proc/irq/{irq}/effective_affinity_list"))
            .is_ok_and(|list| list.trim().parse::<usize>() != Ok(cpu))
    });
    (!moved).then_some(cpu)
}

#[cfg(not(target_os = "linux"))]
fn disk_interrupt_cpu(_: &Path) -> Option<usize> {
    None
}

/// The interrupts of the bus device behind a block device's sysfs directory: the first
/// ancestor listing MSI vectors (`msi_irqs/`), else the first with a legacy `irq` line. A
/// partition's directory sits under its disk's, so both find the same device.
#[cfg(target_os = "linux")]
fn device_irqs(block: &Path) -> Vec<u32> {
    for dir in block
        .ancestors()
        .take_while(|d| d.starts_with("/sys/devices"))
    {
        if let Ok(entries) = std::fs::read_dir(dir.join("msi_irqs")) {
            return entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect();
        }
        let legacy = std::fs::read_to_string(dir.join("irq")).ok();
        if let Some(irq) = legacy
            .and_then(|s| s.trim().parse().ok())
            .filter(|&n| n > 0)
        {
            return vec![irq];
        }
    }
    Vec::new()
}

/// What a `/proc/interrupts` table says of the lines of `irqs`.
#[derive(Debug)]
struct Taken {
    /// The CPU of each column.
    cpus: Vec<usize>,
    /// Interrupts taken on each column's CPU, over all of `irqs`.
    per_cpu: Vec<u64>,
    /// Those of `irqs` that took any.
    fired: Vec<u32>,
}

#[cfg_attr(
    not(target_os = "linux"),
    allow(dead_code, reason = "read only on Linux")
)]
fn taken(table: &str, irqs: &[u32]) -> Option<Taken> {
    let mut lines = table.lines();
    // "CPU0 CPU1 …": offline CPUs have no column, so the numbers are read, not counted.
    let cpus: Vec<usize> = lines
        .next()?
        .split_whitespace()
        .map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect::<Option<_>>()?;
    let mut per_cpu = vec![0u64; cpus.len()];
    let mut fired = Vec::new();
    for line in lines {
        let mut fields = line.split_whitespace();
        let Some(irq) = fields
            .next()
            .and_then(|f| f.strip_suffix(':')?.parse::<u32>().ok())
            .filter(|n| irqs.contains(n))
        else {
            continue;
        };
        let mut any = false;
        for (sum, count) in per_cpu.iter_mut().zip(fields) {
            let count = count.parse().unwrap_or(0);
            any |= count > 0;
            *sum = sum.saturating_add(count);
        }
        if any {
            fired.push(irq);
        }
    }
    Some(Taken {
        cpus,
        per_cpu,
        fired,
    })
}

impl Taken {
    /// The CPU that took at least nine in ten of the interrupts, if any were taken at all.
    #[cfg_attr(
        not(target_os = "linux"),
        allow(dead_code, reason = "read only on Linux")
    )]
    fn one_cpu(&self) -> Option<usize> {
        let total = self.per_cpu.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let (column, &most) = self.per_cpu.iter().enumerate().max_by_key(|&(_, n)| *n)?;
        // most / total >= 9/10, without floating point.
        let one = total > 0 && most.saturating_mul(10) >= total.saturating_mul(9);
        one.then(|| self.cpus.get(column).copied()).flatten()
    }
}

#[cfg(test)]
mod tests {
    fn one_cpu(table: &str, irqs: &[u32]) -> Option<usize> {
        super::taken(table, irqs)?.one_cpu()
    }

    /// A two-CPU VM's table (abridged): virtio1 is the disk, its requests on vector 36.
    const VM: &str = "           CPU0       CPU1       
 28:          0          0 PCI-MSIX-0000:00:01.0   0-edge      virtio0-config
 35:          0          1 PCI-MSIX-0000:00:02.0   0-edge      virtio1-config
 36:          3     547950 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
NMI:          0          0   Non-maskable interrupts
LOC:    9041223    8774410   Local timer interrupts
";

    #[test]
    fn the_cpu_taking_the_disks_interrupts_is_found() {
        assert_eq!(one_cpu(VM, &[35, 36]), Some(1));
        // Only lines that took an interrupt are checked for where they are routed now.
        assert_eq!(super::taken(VM, &[28, 35, 36]).unwrap().fired, [35, 36]);
        // Other devices' lines and the per-CPU summary lines are not counted.
        assert_eq!(one_cpu(VM, &[28]), None, "no interrupt taken at all");
        assert_eq!(one_cpu(VM, &[99]), None, "no such line");
    }

    /// Queues spread over CPUs (NVMe): no CPU takes nine in ten, so nothing is pinned.
    #[test]
    fn spread_interrupts_pin_nothing() {
        let table = "      CPU0  CPU1  CPU2  CPU3
 40:   900   0   0   0   nvme0q1
 41:     0 800   0   0   nvme0q2
 42:     0   0 700  50   nvme0q3
";
        assert_eq!(one_cpu(table, &[40, 41, 42]), None);
        assert_eq!(one_cpu(table, &[42]), Some(2), "700 of 750");
    }

    /// Columns are the CPUs the header names: with CPU1 offline, the second column is CPU2.
    #[test]
    fn cpu_numbers_come_from_the_header() {
        let table = "      CPU0  CPU2\n 36:  1  99  virtio1-req.0\n";
        assert_eq!(one_cpu(table, &[36]), Some(2));
    }

    /// A header that is not a list of CPUs names none; unreadable counts count as zero.
    #[test]
    fn malformed_tables_name_no_cpu() {
        for table in [
            "",
            "garbage",
            "CPU0 X\n 36: 5",
            "CPU0\n36: x y z",
            "CPU0\n: 5",
        ] {
            assert_eq!(one_cpu(table, &[36]), None, "{table:?}");
        }
        assert_eq!(one_cpu("CPU0 CPU1\n 36: 1\n", &[36]), Some(0), "short line");
    }

    /// A file on a file system without a block device of its own (procfs here) pins nothing.
    #[cfg(target_os = "linux")]
    #[test]
    fn no_block_device_no_cpu() {
        assert_eq!(
            super::disk_interrupt_cpu("/proc/self/status".as_ref()),
            None
        );
        assert_eq!(super::disk_interrupt_cpu("/no/such/file".as_ref()), None);
    }

    proptest::proptest! {
        #![proptest_config(oncebox_testkit::seed::Seed::from_env(module_path!()).proptest())]
        /// Whatever the table holds, reading it never panics, and a CPU it names is one of
        /// the header's.
        #[test]
        fn any_table_is_read_without_panic(table in "(CPU[0-9] ){0,3}\n([ 0-9:a-z]{0,20}\n){0,4}") {
            if let Some(cpu) = one_cpu(&table, &[1, 2, 36]) {
                let named = format!("CPU{cpu}");
                proptest::prop_assert!(table.contains(&named));
            }
        }
    }
}
