// SPDX-License-Identifier: Apache-2.0
#pragma once
/// DPDK's Environment Abstraction Layer, set up for spindle: once per process, from options whose
/// defaults work on a machine with no hugepages and no NIC.
///
/// What startEal() asks of EAL, and why:
/// - `--no-huge -m <memoryMb>` unless `hugepages` is set: anonymous memory, no hugetlbfs needed.
/// - `--no-pci` unless PCI devices are named (`-a <address>` each): nothing is probed behind our back.
/// - `--file-prefix=spindle-<pid>` (or the given prefix) and `--no-shconf`: two spindle processes
///   and a dpdk-testpmd run side by side without sharing or fighting over EAL's runtime files.
/// - `--iova-mode=va`, `--no-telemetry`.
/// - `--lcores=0@(<the calling thread's CPUs>)`: EAL's main lcore is the calling thread, left on the
///   CPUs it may already run on; EAL starts no worker lcore threads of its own. Carriers that poll a
///   port register themselves as DPDK threads (registerThread()), which gives them an lcore id and
///   so per-lcore mempool caches.
/// Virtual devices are better opened by Port::open() (hot-plugged, with an error of their own) than
/// listed in `vdevs`: a vdev that EAL cannot create fails startEal() as a whole.
///
/// Errors: startEal() returns EINVAL for options it cannot pass (an empty or oversized argument),
/// EALREADY once EAL is up (or after a failed start: EAL cannot be set up twice in one process),
/// and otherwise rte_errno from rte_eal_init (ENOMEM, ENODEV, EINVAL, EACCES, ...). It writes a
/// sentence naming the EAL arguments and the cause to `*why` when given, and logs it. DPDK never
/// exits the process from here: rte_eal_init reports its errors by return value.
/// Thread-safety: startEal() and stopEal() are serialised by a lock; registerThread() and
/// unregisterThread() act on the calling thread.

#include <cstddef>
#include <string>
#include <vector>

#include "base/result.h"

namespace spindle::dpdk {

struct EalOptions {
    size_t memoryMb = 256;                  // -m, without hugepages (ignored with them)
    bool hugepages = false;                 // true: use hugetlbfs as EAL would by default
    std::vector<std::string> pciDevices;    // -a each; empty: --no-pci
    std::vector<std::string> vdevs;         // --vdev each (see above: prefer Port::open)
    std::string filePrefix;                 // empty: spindle-<pid>
    std::string logLevel = "*:warning";     // --log-level
    std::vector<std::string> extraArgs;     // appended as given, last
};

/// The argument vector startEal() would pass to rte_eal_init (argv[0] included), for logs and tests.
/// Errors: EINVAL for an empty PCI address or vdev string.
[[nodiscard]] Result<std::vector<std::string>> ealArguments(const EalOptions& options) noexcept;

/// Sets EAL up (see the file comment). Errors: see the file comment.
[[nodiscard]] Result<void> startEal(const EalOptions& options, std::string* why = nullptr) noexcept;

/// Whether startEal() succeeded and stopEal() has not run.
[[nodiscard]] bool ealRunning() noexcept;

/// Releases EAL's resources (rte_eal_cleanup) and removes its runtime directory. Every port must be
/// closed and every registered thread unregistered first. EAL cannot be started again afterwards.
/// Errors: ENXIO when EAL is not running; EBUSY while threads are registered.
[[nodiscard]] Result<void> stopEal() noexcept;

/// Registers the calling thread as a DPDK thread (rte_thread_register) or, when it is one already,
/// counts one more user. Errors: ENXIO when EAL is not running; ENOSPC when DPDK has no lcore id
/// left (RTE_MAX_LCORE); EINVAL from DPDK.
[[nodiscard]] Result<void> registerThread() noexcept;
/// Drops one user of the calling thread's registration; the last one unregisters it.
/// Precondition: a registerThread() on this thread that succeeded.
void unregisterThread() noexcept;

}  // namespace spindle::dpdk
